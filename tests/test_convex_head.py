"""The linear-probe classifier: features of norm <= 1, the train-head command, and certify taking its checkpoint."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from training.linear_probe import LinearProbe, normalise_features


def test_features_have_norm_at_most_one_and_penultimate_matches_the_classifier(classifier_dir):
    from training.checkpoint import load_checkpoint

    base = load_checkpoint(classifier_dir, kind="classifier")
    probe = LinearProbe("penultimate", 10, base_architecture=base.metadata["architecture"],
                        base_kwargs=base.metadata["arch_kwargs"])
    probe.extractor.load_state_dict(base.model.state_dict(), strict=False)
    images = torch.rand(6, 1, 28, 28)
    images[0] = 0
    images[1] = 1
    with torch.no_grad():
        embedded = probe.embed(images)
        model = base.model
        reference = model.head[:-1](model.features(model.normalize(images)))  # Flatten, Linear, ReLU, Dropout
    assert embedded.shape == (6, 129)
    assert torch.all(embedded.norm(dim=1) <= 1 + 1e-6)
    unit = reference / reference.norm(dim=1, keepdim=True)
    assert torch.allclose(embedded[:, :-1] * 2 ** 0.5, unit, atol=1e-5)
    assert torch.allclose(embedded[:, -1], torch.full((6,), 2 ** -0.5))
    zero = normalise_features(torch.zeros(2, 5))
    assert torch.allclose(zero.norm(dim=1), torch.full((2,), 2 ** -0.5))


def test_train_head_writes_a_classifier_that_certify_takes(classifier_dir, tmp_path, capsys):
    from transdenoiser.cli import main

    out = tmp_path / "head"
    code = main(["train-head", "--algorithm", "opera", "--loss", "softmax", "--epsilon", "2", "--delta", "1e-5",
                 "--classifier", str(classifier_dir), "--opera-sensitivity", "minimizer", "--lambda", "0.01",
                 "--out", str(out), "--device", "cpu"])
    assert code == 0
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["kind"] == "classifier" and meta["architecture"] == "linear-probe"
    assert meta["dataset"]["trained_on"] == "private"
    assert meta["dataset"]["features_from"]["classifier_trained_on"] == "public"
    privacy = meta["privacy"]
    assert privacy["mechanism"] == "OPERA" and privacy["epsilon"] == 2 and privacy["data_independent"] is True
    assert "analytic Gaussian" in privacy["calibration"] and "replace-one" in privacy["neighbouring"]
    n = meta["train"]["private_examples"]
    assert privacy["sensitivity"] == pytest.approx(2 * 2 ** 0.5 / (n * 0.01), rel=2e-3)
    assert meta["test_accuracy"] > 0.5  # the frozen features are good; epsilon 2 costs little
    assert "epsilon = 2" in (out / "privacy_report.txt").read_text()
    assert privacy["noise"] == {"mode": "secret", "seed": None, "source": privacy["noise"]["source"]}

    code = main(["certify", "--classifier", str(out), "--sigma", "0.25", "--n0", "10", "--n", "50", "--max", "1000",
                 "--skip", "500", "--out", str(tmp_path / "cert"), "--device", "cpu"])
    assert code == 0
    rows = (tmp_path / "cert" / "certify.tsv").read_text().strip().splitlines()
    assert len(rows) == 3  # header + 2 images


def test_train_head_refuses_features_not_trained_on_public_data(classifier_dir, tmp_path, capsys):
    import shutil

    from transdenoiser.cli import main

    copy = tmp_path / "clf"
    shutil.copytree(classifier_dir, copy)
    meta = json.loads((copy / "metadata.json").read_text())
    meta["dataset"]["trained_on"] = "private"
    (copy / "metadata.json").write_text(json.dumps(meta))
    code = main(["train-head", "--epsilon", "1", "--classifier", str(copy), "--out", str(tmp_path / "h"),
                 "--device", "cpu"])
    assert code == 2
    assert "not a public split" in capsys.readouterr().err


def test_pixels_head_by_grpua_loads_back(tmp_path):
    from training.checkpoint import load_checkpoint
    from training.convex.train import HeadConfig, train_head
    from training.datasets import Dataset, Split

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(3), 40)
    images = (rng.random((120, 1, 4, 4)) * 60).astype(np.uint8)
    images[:, 0, labels, labels] = 255  # one bright pixel per class
    split = Split(images, labels)
    dataset = Dataset("toy", ("a", "b", "c"), split, split, split, "generated", 0)
    config = HeadConfig(algorithm="grpua", loss="huber-svm", epsilon=8.0, features="pixels", reg=0.01, steps=3000,
                        grpua_accountant="rdp")
    model, meta = train_head(dataset, config, None, torch.device("cpu"), seed=0)
    assert meta["privacy"]["epsilons"]["rdp"] <= 8.0
    from training.checkpoint import save_checkpoint

    save_checkpoint(tmp_path / "h", model, meta)
    loaded = load_checkpoint(tmp_path / "h", kind="classifier").model
    x = torch.from_numpy(images[:10]).float() / 255
    assert torch.equal(loaded(x), model(x))
    # the DP noise is secret: the same seed gives a different head, unless reproducible_noise (flagged)
    again, _ = train_head(dataset, config, None, torch.device("cpu"), seed=0)
    assert not torch.equal(again.weight, model.weight)
    from dataclasses import replace

    first, meta_r = train_head(dataset, replace(config, reproducible_noise=True), None, torch.device("cpu"), seed=0)
    second, _ = train_head(dataset, replace(config, reproducible_noise=True), None, torch.device("cpu"), seed=0)
    assert torch.equal(first.weight, second.weight) and meta_r["privacy"]["noise"]["mode"] == "reproducible"
