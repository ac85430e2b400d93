"""One writer per run directory: a lock that a second process is refused at once, naming the holder.

``with RunLock(directory):`` takes an exclusive, non-blocking ``flock`` on ``.NAME.lock`` beside the
directory NAME (beside, not inside: a checkpoint directory is replaced whole at every save) and writes the
holder's PID, host and command into it. A second process (or a second lock in the same
process) gets a :class:`~transdenoiser.errors.UserError` naming the holder's PID. The operating system
drops the lock when its holder exits, however it exits (also ``kill -9``), so the lock of a dead process
is taken over by the next writer; there is nothing stale to clean up. The lock file itself stays (removing
it while another process may be opening it would let two writers lock two different files).

Where ``fcntl`` is missing (Windows) the file is created exclusively instead, and a lock whose PID no
longer runs on this host is taken over.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from transdenoiser.errors import UserError

LOCK_SUFFIX = ".lock"  # the lock of DIR/NAME is DIR/.NAME.lock

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


def lock_path(directory: str | Path, part: str | None = None) -> Path:
    """Where the lock of ``directory`` lives: ``.NAME.lock`` in its parent (``.NAME.PART.lock`` for one part of
    it, e.g. one shard of a run that several processes write side by side)."""
    directory = Path(directory).absolute()
    return directory.parent / f".{directory.name}{'.' + part if part else ''}{LOCK_SUFFIX}"


def _holder_text(path: Path) -> str:
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        holder = {}
    if not isinstance(holder, dict) or "pid" not in holder:
        return "another process"
    text = f"process {holder['pid']}"
    if holder.get("host") and holder["host"] != socket.gethostname():
        text += f" on {holder['host']}"
    if holder.get("command"):
        text += f" ({holder['command']})"
    return text


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """An exclusive lock on a run directory, held from :meth:`acquire` (or ``with``) to :meth:`release`."""

    def __init__(self, directory: str | Path, purpose: str | None = None, part: str | None = None):
        self.directory = Path(directory)
        self.part = part
        self.path = lock_path(self.directory, part)
        self.purpose = purpose or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]).strip()
        self._fd: int | None = None

    def _record(self) -> bytes:
        return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": self.purpose,
                           "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode()

    def _refuse(self) -> UserError:
        what = f"{self.directory} ({self.part})" if self.part else str(self.directory)
        return UserError(f"{what} is being written by {_holder_text(self.path)}; two runs must not write "
                         "into one directory: wait for it to finish or choose another --out")

    def acquire(self) -> RunLock:
        if self._fd is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fcntl is None:  # pragma: no cover - Windows
            return self._acquire_exclusive_create()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise self._refuse() from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, self._record(), 0)
        self._fd = fd
        return self

    def _acquire_exclusive_create(self) -> RunLock:  # pragma: no cover - Windows
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                try:
                    holder = json.loads(self.path.read_text() or "{}")
                except (OSError, ValueError):
                    holder = {}
                pid = holder.get("pid") if isinstance(holder, dict) else None
                if (isinstance(pid, int) and holder.get("host") == socket.gethostname() and not _pid_alive(pid)):
                    self.path.unlink(missing_ok=True)  # stale: its process is gone
                    continue
                raise self._refuse() from None
            os.write(fd, self._record())
            self._fd = fd
            return self
        raise self._refuse()

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        else:  # pragma: no cover - Windows
            os.close(fd)
            self.path.unlink(missing_ok=True)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
