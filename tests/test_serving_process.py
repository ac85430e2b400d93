"""``serving.process.ServerProcess``: a server whose free port (or one of BentoML's control ports) was taken before it
could bind it starts again on other ports; any other early exit is reported at once. A stand-in server (a few lines
of Python that bind the port as BentoML does, then answer /readyz) keeps the test to a second."""
from __future__ import annotations

import socket
import sys
import time

import pytest

import serving.process as process_module
from serving.process import HOST, ServerProcess

STAND_IN = """
import http.server, socket, sys
port = int(sys.argv[1])
try:
    server = http.server.HTTPServer(("127.0.0.1", port), http.server.BaseHTTPRequestHandler)
except OSError:
    print(f"[ERROR] [cli] Could not bind 127.0.0.1:{port}", flush=True)
    sys.exit(1)
class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
server.RequestHandlerClass = Ready
server.serve_forever()
"""


class StandIn(ServerProcess):
    def command(self) -> list[str]:
        return [sys.executable, "-c", STAND_IN, str(self.port)]


FAILS = "print('no model directory'); raise SystemExit(2)"


class FailsAtOnce(ServerProcess):
    def command(self) -> list[str]:
        return [sys.executable, "-c", FAILS]


def test_a_port_taken_before_the_server_binds_it_is_replaced(tmp_path, monkeypatch):
    taken = socket.socket()
    taken.bind((HOST, 0))
    taken.listen()
    ports = [taken.getsockname()[1]]  # the first "free" port is in use by the time the server binds it
    real = process_module.free_port
    monkeypatch.setattr(process_module, "free_port", lambda: ports.pop() if ports else real())
    server = StandIn(tmp_path / "model", tmp_path / "server.log")
    try:
        server.wait_ready(time.monotonic() + 30)
        assert server.attempts == 2 and server.port != taken.getsockname()[1]
        assert server.url == f"http://{HOST}:{server.port}"
        assert f"Could not bind {HOST}:{taken.getsockname()[1]}" in server.log.read_text()  # the log kept
    finally:
        server.stop()
        taken.close()


FIRST_START_LOSES_A_PORT = """
import pathlib, sys
marker = pathlib.Path(sys.argv[2])
if not marker.exists():  # the first start lost a port race: argv[3] is what the server said, argv[4] its status
    marker.write_text("lost")
    print(sys.argv[3], flush=True)
    sys.exit(int(sys.argv[4]))
"""


def losing_a_port_once(message: str, status: int, then: str = STAND_IN) -> type[ServerProcess]:
    """A server whose first start exits with ``message`` and ``status``; the later starts run ``then``."""
    class LosesAPortOnce(ServerProcess):
        def command(self) -> list[str]:
            return [sys.executable, "-c", FIRST_START_LOSES_A_PORT + then, str(self.port),
                    str(self.log.parent / "lost"), message, str(status)]

    return LosesAPortOnce


@pytest.mark.parametrize("message, status", [
    # circus's ZMQ control socket (BentoML exits 1 with the ZMQError, no "Could not bind")
    ("zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:36725')", 1),
    # `transdenoiser serve`'s own check of the port, before BentoML starts
    ("transdenoiser serve: error: port 41234 on 127.0.0.1 is already in use (another server running?): stop it or "
     "pass --port N", 2),
])
def test_a_server_that_lost_another_port_race_starts_again(tmp_path, message, status):
    server = losing_a_port_once(message, status)(tmp_path / "model", tmp_path / "server.log")
    try:
        server.wait_ready(time.monotonic() + 30)
        assert server.attempts == 2 and (tmp_path / "lost").exists()
        assert server.url == f"http://{HOST}:{server.port}"
        assert message in server.log.read_text()  # the first attempt's log kept
    finally:
        server.stop()


def test_a_port_race_of_an_earlier_attempt_does_not_hide_a_real_failure(tmp_path):
    """Only the latest attempt's part of the log decides: a first start that lost its port, then a second that
    fails for another reason, is reported, not started a third time."""
    kind = losing_a_port_once("[ERROR] [cli] Could not bind 127.0.0.1:1", 1, then=FAILS)
    server = kind(tmp_path / "model", tmp_path / "server.log")
    with pytest.raises(RuntimeError, match="exited with status 2:\n(.|\n)*no model directory"):
        server.wait_ready(time.monotonic() + 30)
    assert server.attempts == 2 and "Could not bind" in server.log.read_text()


def test_a_server_that_exits_for_another_reason_is_reported_at_once(tmp_path):
    server = FailsAtOnce(tmp_path / "model", tmp_path / "server.log")
    with pytest.raises(RuntimeError, match="exited with status 2:\n.*no model directory"):
        server.wait_ready(time.monotonic() + 30)
    assert server.attempts == 1


TERMINATED = """
import contextlib, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_serving_process import StandIn
from serving.process import stop_on_terminate

with (stop_on_terminate() if {handled!r} else contextlib.nullcontext()):
    server = StandIn(Path({model!r}), Path({log!r}))
    try:
        server.wait_ready(time.monotonic() + 30)
        print(server.process.pid, flush=True)
        time.sleep(60)
    finally:
        server.stop()
"""


@pytest.mark.parametrize("handled", [True, False], ids=["stop_on_terminate", "without"])
def test_a_process_terminated_while_it_runs_a_server_stops_the_server(tmp_path, handled):
    """SIGTERM (``timeout``, a job runner) to a process inside ``stop_on_terminate`` stops the servers it started;
    without it they outlive it, as they run in sessions of their own (the control: the check can fail)."""
    import os
    import signal
    import subprocess
    from pathlib import Path

    import psutil

    script = TERMINATED.format(tests=str(Path(__file__).parent), model=str(tmp_path), log=str(tmp_path / "log"),
                               handled=handled)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).parent.parent)
    server = None
    try:
        server = psutil.Process(int(parent.stdout.readline()))
        os.kill(parent.pid, signal.SIGTERM)
        parent.wait(timeout=30)
        assert parent.returncode != 0
        _, alive = psutil.wait_procs([server], timeout=10 if handled else 1)  # stopped at once, or never
        assert (alive == []) is handled
    finally:
        if parent.poll() is None:
            parent.kill()
        if server is not None and server.is_running():
            server.kill()


def test_outside_the_main_thread_the_signal_handling_is_left_alone():
    import signal
    import threading

    from serving.process import stop_on_terminate

    before = signal.getsignal(signal.SIGTERM)
    seen = []

    def inside():
        with stop_on_terminate():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=inside)
    thread.start()
    thread.join()
    assert seen == [before]
    with stop_on_terminate():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
