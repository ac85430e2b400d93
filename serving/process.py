"""A ``transdenoiser serve`` subprocess on 127.0.0.1, for tests and benchmarks: start, wait until ready, stop.

Loopback only; every wait is bounded; ``stop`` sends SIGTERM (BentoML stops its workers gracefully),
then kills by pid whatever of the process and its descendants is still alive.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

from serving.auth import API_KEY_ENV

HOST = "127.0.0.1"


@contextlib.contextmanager
def stop_on_terminate() -> Iterator[None]:
    """While inside, SIGTERM (from ``timeout`` or a job runner) raises KeyboardInterrupt in this process, as Ctrl-C
    does, so the ``finally`` clauses that stop its servers run. A server starts in a session of its own
    (``start_new_session``), so the signal does not reach it, and it would outlive the process that started it.
    Only from the main thread, where Python runs signal handlers; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class ServerProcess:
    """``transdenoiser serve --model-dir MODEL_DIR`` on a free loopback port, logging to ``log``.

    A free port is found by binding port 0 and closing it, so another process may take it before the server binds
    it (any outgoing connection's ephemeral port can). BentoML's process manager (circus) reserves two more loopback
    ports the same way for its ZMQ control sockets, with the same race. A server that exits at start-up because one
    of its ports was taken is started again on other ports (``BIND_ATTEMPTS`` in all), the log appended: ``url`` is
    final once :meth:`wait_ready` returns. Any other exit is reported at once, with the log's tail."""

    BIND_ATTEMPTS = 3
    # what a start-up that lost a port race leaves in the log: circus's message for the HTTP socket; the OSError /
    # ZMQError text of errno EADDRINUSE, "Address already in use", for any socket, the ZMQ control sockets included;
    # `transdenoiser serve`'s own check, "port N on HOST is already in use"
    PORT_TAKEN = ("Could not bind", "already in use")

    def __init__(self, model_dir: Path, log: Path, api_key: str | None = None, device: str = "cpu"):
        self.model_dir, self.log, self.api_key, self.device = model_dir, Path(log), api_key, device
        self.attempts = 0
        self._start()

    def _start(self) -> None:
        self.attempts += 1
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        env = {**os.environ, "BENTOML_HOME": str(self.log.parent / f"bentoml-{self.port}"),
               "BENTOML_DO_NOT_TRACK": "True"}
        env.pop(API_KEY_ENV, None)
        if self.api_key:
            env[API_KEY_ENV] = self.api_key
        with self.log.open("wb" if self.attempts == 1 else "ab") as handle:
            self.log_start = handle.tell()  # where this attempt's part of the log begins
            self.process = subprocess.Popen(self.command(), env=env, stdout=handle, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "transdenoiser.cli", "serve", "--model-dir", str(self.model_dir), "--host", HOST,
                "--port", str(self.port), "--device", self.device]

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def lost_port_race(self) -> bool:
        """Whether this attempt's part of the log says a port it reserved was taken before it could bind it."""
        with self.log.open("rb") as handle:
            handle.seek(self.log_start)
            text = handle.read().decode(errors="replace")
        return any(marker in text for marker in self.PORT_TAKEN)

    def wait_ready(self, deadline: float) -> None:
        """Poll /readyz until it answers 200; ``deadline`` is a ``time.monotonic()`` value."""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if self.lost_port_race() and self.attempts < self.BIND_ATTEMPTS:
                    self._start()  # a port was taken between finding it free and binding it: other ones
                    continue
                raise RuntimeError(f"server exited with status {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"server at {self.url} not ready in time:\n{self.log_tail()}")

    def stop(self, timeout: float = 20) -> None:
        try:
            root = psutil.Process(self.process.pid)
            family = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            family = []
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(family, timeout=timeout)
        for process in alive:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        self.process.wait(timeout=5)
