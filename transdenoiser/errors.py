"""The one exception type the command line turns into a one-line error message."""


class UserError(Exception):
    """Bad input from the user (flags, files, checkpoints, requests). The message names the problem."""
