"""Progress in logs and pipes: a line every few seconds with count, rate and ETA; pretrain shows batches and loss."""
from __future__ import annotations

import io
import sys

import torch

from transdenoiser import progress


def test_log_lines_every_interval_with_rate_and_eta():
    ticks = iter([0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 18.0, 20.0, 20.0])  # 2 s per item
    stream = io.StringIO()
    tracked = progress.LogProgress(range(10), desc="certify", stream=stream, interval=5.0, clock=lambda: next(ticks))
    assert list(tracked) == list(range(10))
    lines = stream.getvalue().splitlines()
    # at 6 s, 3 of 10 done: 0.5 per second, 7 left -> 14 s; at 12 s, 6 done -> 8 s; at 18 s, 9 done -> 2 s
    assert lines == ["certify: 3/10 (30%), 0.5 it/s, 0:06 elapsed, ETA 0:14",
                     "certify: 6/10 (60%), 0.5 it/s, 0:12 elapsed, ETA 0:08",
                     "certify: 9/10 (90%), 0.5 it/s, 0:18 elapsed, ETA 0:02",
                     "certify: 10/10 (100%), 0.5 it/s, done in 0:20"]


def test_postfix_and_unknown_total():
    ticks = iter([0.0, 1.0, 2.0, 3.0])
    stream = io.StringIO()
    tracked = progress.LogProgress(iter("ab"), desc="steps", stream=stream, interval=1.0, clock=lambda: next(ticks))
    for _ in tracked:
        tracked.set_postfix(loss="0.25", refresh=False)
    assert stream.getvalue().splitlines() == ["steps: 1, 1 it/s, 0:01 elapsed, loss 0.25",
                                              "steps: 2, 1 it/s, 0:02 elapsed, loss 0.25",
                                              "steps: 2, 0.667 it/s, done in 0:03, loss 0.25"]


def test_bar_logs_when_stderr_is_not_a_terminal(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert isinstance(progress.bar(range(3), desc="x"), progress.LogProgress)
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert not isinstance(progress.bar(range(3), desc="x"), progress.LogProgress)


def test_pretrain_reports_batches_and_loss_in_a_log(tmp_path, monkeypatch):
    from tests.test_datasets import make_mnist_layout
    from training.datasets import load_dataset
    from training.pretrain import PretrainConfig, pretrain_classifier

    make_mnist_layout(tmp_path, "MNIST", n_train=40, n_test=10, compress=False)
    dataset = load_dataset("mnist", tmp_path)
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(progress, "LOG_INTERVAL_SECONDS", 0.0)
    pretrain_classifier(dataset, PretrainConfig(epochs=2, batch_size=8), torch.device("cpu"), seed=0,
                        track=progress.bar)
    lines = log.getvalue().splitlines()
    steps = -(-len(dataset.public) // 8)
    assert f"pretrain epoch 1/2: 1/{steps} ({100 // steps}%)" in lines[0] and "loss " in lines[0]
    assert any(line.startswith("pretrain epoch 2/2 (test accuracy ") for line in lines)
    assert sum("done in" in line for line in lines) == 2
