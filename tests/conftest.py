"""Shared fixtures. Heavy objects are session-scoped so the suite stays well under 10 minutes on 2 CPU cores."""
from __future__ import annotations

import contextlib

import pytest
import torch

torch.set_num_threads(2)


def pytest_sessionfinish(session, exitstatus):
    """An in-process service's warm-up freezes every object then alive (``freeze_start_up_objects``, right for a
    server): in the test process, every earlier test's objects too. Unfrozen and collected at the end, they are gone
    before the interpreter exits, so no extension module reports them as leaked (triton's bindings list hundreds).
    The session's state directory (``pytest_configure``) is removed."""
    import gc
    import shutil

    gc.unfreeze()
    gc.collect()
    if SESSION_STATE:
        shutil.rmtree(SESSION_STATE[0], ignore_errors=True)


SESSION_STATE: list[str] = []  # the session's state directory, made by pytest_configure


def pytest_configure(config):
    """Certify runs record their tests in a ledger in the user's state directory (certify.ledger): for the whole
    session (fixtures of module or session scope, their subprocesses included) a state directory of the session's
    own, never the user's; each test then gets a fresh one (``certification_ledger``)."""
    import os
    import tempfile

    SESSION_STATE.append(tempfile.mkdtemp(prefix="transdenoiser-state-"))
    os.environ["TRANSDENOISER_STATE_DIR"] = SESSION_STATE[0]


@pytest.fixture(autouse=True)
def certification_ledger(tmp_path_factory, monkeypatch):
    """Each test's own state directory (TRANSDENOISER_STATE_DIR), so that certify runs record their tests in a
    fresh ledger (certify.ledger): never in the user's home, never seen by another test. Yields the ledger's path."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("TRANSDENOISER_STATE_DIR", str(state))
    yield state / "certify-ledger.jsonl"


@pytest.fixture(scope="session")
def mnist10k():
    from training.datasets import load_dataset

    return load_dataset("mnist10k")


@pytest.fixture(scope="session")
def classifier_dir(tmp_path_factory, mnist10k):
    """A cnn28 classifier trained 3 epochs on mnist10k's public split (about 15 s on 2 cores), saved as a checkpoint."""
    from training.checkpoint import save_checkpoint
    from training.pretrain import PretrainConfig, pretrain_classifier

    model, meta = pretrain_classifier(mnist10k, PretrainConfig(epochs=3), torch.device("cpu"), seed=0)
    assert meta["test_accuracy"] > 0.9, meta["test_accuracy"]
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "classifier", model, meta)


@pytest.fixture(scope="session")
def classifier(classifier_dir):
    from training.checkpoint import load_checkpoint

    return load_checkpoint(classifier_dir, kind="classifier").model


def forget_bentoml_metrics() -> None:
    """An in-process BentoML app registers its request metrics in prometheus_client's default registry, and a
    second app in the same test process would register them again (DuplicateTimeseries). The in-process
    service fixtures call this when they tear their app down."""
    from prometheus_client import REGISTRY

    for collector, names in list(REGISTRY._collector_to_names.items()):
        if any(name.startswith("bentoml_") for name in names):
            REGISTRY.unregister(collector)


@contextlib.contextmanager
def in_process_service(model_dir):
    """A Starlette test client of the BentoML service over ``model_dir`` (CPU, no API key), torn down cleanly."""
    from starlette.testclient import TestClient

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRANSDENOISER_MODEL_DIR", str(model_dir))
        patch.setenv("TRANSDENOISER_DEVICE", "cpu")
        patch.delenv("TRANSDENOISER_API_KEY", raising=False)
        from serving.service import TransDenoiser

        try:
            with TestClient(TransDenoiser.to_asgi(), raise_server_exceptions=False) as client:
                yield client
        finally:
            forget_bentoml_metrics()


@pytest.fixture(scope="session")
def random_classifier_dir(tmp_path_factory):
    """An untrained cnn28 (seed 0) saved as an mnist10k classifier checkpoint: for tests of run bookkeeping, training
    mechanics and serving, which need a frozen classifier, not a good one."""
    from training.checkpoint import save_checkpoint
    from training.models import build_model

    torch.manual_seed(0)
    kwargs = {"in_channels": 1, "num_classes": 10}
    meta = {"kind": "classifier", "architecture": "cnn28", "arch_kwargs": kwargs, "input_shape": [1, 28, 28],
            "num_classes": 10, "class_names": [str(d) for d in range(10)], "test_accuracy": None,
            "dataset": {"name": "mnist10k", "trained_on": "public"}}
    return save_checkpoint(tmp_path_factory.mktemp("random_classifier") / "classifier",
                           build_model("cnn28", **kwargs), meta)


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test: small models' forward passes only lose time to a second thread (much more so
    while other jobs share the cores). Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def serve_dry_run(model_dir, *options) -> list[str]:
    """``serve --dry-run`` argv on a free port: its checks include that the port is free, and port 3000, the
    default, may hold the user's own ``make serve`` while the suite runs."""
    from serving.process import free_port

    return ["serve", "--model-dir", str(model_dir), "--port", str(free_port()), *options, "--dry-run"]


def run_cli(argv, capsys):
    """Run the ``transdenoiser`` CLI in process with ``argv`` (each item str()-ed): (exit code, stdout, stderr)."""
    from transdenoiser.cli import main

    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err
