"""One writer per run directory: refused at once naming the holder's PID; a dead holder's lock is taken over."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from transdenoiser.errors import UserError
from transdenoiser.lock import RunLock, lock_path

HOLD = ("import sys, time; from transdenoiser.lock import RunLock; "
        "lock = RunLock(sys.argv[1], purpose='certify --out run').acquire(); print('held', flush=True); "
        "time.sleep(120)")


@pytest.fixture
def holder(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    yield process
    if process.poll() is None:
        process.kill()
        process.wait()


def test_second_process_is_refused_naming_the_holder_then_takes_over_when_it_dies(tmp_path, holder):
    with pytest.raises(UserError) as refused:
        RunLock(tmp_path / "run").acquire()
    message = str(refused.value)
    assert f"process {holder.pid} (certify --out run)" in message and "\n" not in message
    os.kill(holder.pid, signal.SIGKILL)  # dies without releasing anything
    holder.wait()
    with RunLock(tmp_path / "run") as lock:
        assert lock.held
        assert f'"pid": {os.getpid()}' in lock_path(tmp_path / "run").read_text()


def test_one_process_two_locks_and_release(tmp_path):
    first = RunLock(tmp_path / "run").acquire()
    with pytest.raises(UserError, match=f"process {os.getpid()}"):
        RunLock(tmp_path / "run").acquire()
    first.release()
    with RunLock(tmp_path / "run"):
        pass


def test_lock_holds_while_the_directory_is_replaced_whole(tmp_path):
    from training.checkpoint import replace_directory

    run = tmp_path / "denoiser"
    with RunLock(run):
        for _ in range(2):  # what every epoch's checkpoint save does
            replace_directory(run, lambda staging: (staging / "metadata.json").write_text("{}"))
        with pytest.raises(UserError, match="being written by"):
            RunLock(run).acquire()
    assert sorted(p.name for p in run.iterdir()) == ["metadata.json"]  # nothing added inside the run


def test_parts_of_one_directory_lock_separately(tmp_path):
    with RunLock(tmp_path / "run", part="shard-0-of-2"), RunLock(tmp_path / "run", part="shard-1-of-2"):
        with pytest.raises(UserError, match=r"run \(shard-0-of-2\) is being written"):
            RunLock(tmp_path / "run", part="shard-0-of-2").acquire()


def test_attack_refuses_an_out_another_process_writes(tmp_path, holder, capsys):
    """`transdenoiser attack` takes the run lock of its --out, as certify and train do: a second writer gets one
    line naming the holder, exit status 2, and nothing is written."""
    from transdenoiser.cli import main

    (tmp_path / "classifier").mkdir()  # a folder, so the path check passes; the lock refuses before it is loaded
    code = main(["attack", "--classifier", str(tmp_path / "classifier"), "--attack", "pgd", "--eps", "0.5",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"process {holder.pid} (certify --out run)" in err and "\n" not in err
    assert not (tmp_path / "run").exists()
