"""A ``transdenoiser serve`` subprocess on 127.0.0.1, for tests and benchmarks: start, wait until ready, stop.

Loopback only; every wait is bounded; ``stop`` sends SIGTERM (BentoML stops its workers gracefully),
then kills by pid whatever of the process and its descendants is still alive.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from serving.auth import API_KEY_ENV

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class ServerProcess:
    """``transdenoiser serve --model-dir MODEL_DIR`` on a free loopback port, logging to ``log``."""

    def __init__(self, model_dir: Path, log: Path, api_key: str | None = None, device: str = "cpu"):
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.log = Path(log)
        env = {**os.environ, "BENTOML_HOME": str(self.log.parent / f"bentoml-{self.port}"),
               "BENTOML_DO_NOT_TRACK": "True"}
        env.pop(API_KEY_ENV, None)
        if api_key:
            env[API_KEY_ENV] = api_key
        with self.log.open("wb") as handle:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "transdenoiser.cli", "serve", "--model-dir", str(model_dir), "--host", HOST,
                 "--port", str(self.port), "--device", device],
                env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def wait_ready(self, deadline: float) -> None:
        """Poll /readyz until it answers 200; ``deadline`` is a ``time.monotonic()`` value."""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
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
