"""The exception types the command line turns into a one-line error message (exit status 2).

Both are ``ValueError`` subclasses, so Python API users can catch them the usual way:

- :class:`UserError`: bad input from the user (flags, files, requests, arguments).
- :class:`CheckpointError`: a checkpoint that fails an integrity check (SHA-256 mismatch, truncated or tampered
  file, unreadable metadata, weights that do not fit the recorded architecture). It is a :class:`UserError`.
"""


class UserError(ValueError):
    """Bad input from the user (flags, files, checkpoints, requests). The message names the problem."""


class CheckpointError(UserError):
    """A checkpoint failed an integrity check (hash, truncation, tampering, architecture). The message names it."""
