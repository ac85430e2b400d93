"""A denoiser that makes the classifier less accurate under noise than no denoiser is never shipped silently (issue
66): `train`, `certify` and `serve` print a multi-line warning with the two figures and the likely causes, and
`bundle` refuses it in one line unless `--allow-worse-than-classifier`, which serving.toml and the model card record.
A denoiser that is not worse: none of it.

The worse denoiser is real: the tiny autoencoder trained one epoch on 32 private examples, in front of the suite's
trained cnn28 (about 0.1 with the denoiser against about 0.9 without at sigma 0.25). The one that is not worse is the
same checkpoint with its recorded figure for the classifier alone lowered (metadata.json is not hash-checked; the
weights are), or a training run whose classifier-alone figure is patched below the denoiser's."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import run_cli, serve_dry_run
from transdenoiser.checks import ALLOW_WORSE_FLAG, check_not_worse_than_classifier, worse_than_classifier
from transdenoiser.errors import UserError
from transdenoiser.records import WORSE_Z, VersusClassifier

TRAIN = ["train", "--arm", "sepdp", "--denoiser", "tiny", "--epochs", "1", "--train-examples", "32",
         "--batch-size", "16", "--eval-examples", "60", "--delta", "1e-3", "--target-epsilon", "8", "--device", "cpu"]


def test_the_rule_is_a_one_sided_margin_on_the_recorded_images():
    """The issue's own run (3 classes, 18 test images: 0.3889 with, 0.7778 without) is worse; one image fewer of 18
    is within the sampling margin; equal is never worse; without a count of images any lower figure is."""
    issue = VersusClassifier(7 / 18, 14 / 18, images=18)
    assert issue.worse and issue.images_lost == 7
    assert issue.margin == pytest.approx(WORSE_Z * ((7 / 18 * 11 / 18 + 14 / 18 * 4 / 18) / 18) ** 0.5)
    assert not VersusClassifier(17 / 18, 18 / 18, images=18).worse
    assert not VersusClassifier(0.5, 0.5, images=1000).worse and not VersusClassifier(0.9, 0.5, images=10).worse
    assert VersusClassifier(0.49, 0.5).worse and not VersusClassifier(0.5, 0.5).worse  # images not recorded
    assert VersusClassifier(0.0, 1.0, images=5).worse  # no sampling variance, all lost
    # the boundary: lower by just more than the margin is worse, by just less is not
    edge = VersusClassifier(0.5, 0.6, images=400)
    assert edge.worse == (0.1 > edge.margin)
    assert not VersusClassifier(0.5, 0.5 + 0.99 * VersusClassifier(0.5, 0.5, images=400).margin, images=400).worse


def _metadata(with_denoiser: float, without: float, images: int | None = 18) -> dict:
    baselines = {"accuracy_clean": 0.9, "accuracy_noisy_no_denoiser": without}
    if images is not None:
        baselines["images"] = images
    return {"kind": "denoiser", "architecture": "tiny", "sigma": 0.25,
            "metrics": [{"accuracy_denoised": with_denoiser}], "baselines": baselines, "steps_done": 2,
            "dataset": {"name": "imagefolder", "train_examples": 27},
            "privacy": {"arm": "sepdp", "target_epsilon": 1.0}}


def test_the_warning_names_both_figures_and_the_likely_causes_and_bundle_refuses_in_one_line():
    worse = worse_than_classifier(_metadata(7 / 18, 14 / 18))
    assert worse is not None
    from transdenoiser.checks import worse_than_classifier_warning

    text = worse_than_classifier_warning(worse, "denoiser runs/d")
    assert text.startswith("WARNING: denoiser runs/d makes the classifier LESS accurate") and len(text.splitlines()) > 4
    assert "with denoiser 0.3889; without 0.7778 (7 fewer of 18 test images" in text
    assert "too little private data for this epsilon: 27 private examples at epsilon 1" in text
    assert "too few steps: 2 steps" in text and ALLOW_WORSE_FLAG in text
    with pytest.raises(UserError) as refused:
        check_not_worse_than_classifier(_metadata(7 / 18, 14 / 18), allow=False, denoiser="denoiser runs/d")
    line = str(refused.value)
    assert "\n" not in line and "0.3889" in line and "0.7778" in line and ALLOW_WORSE_FLAG in line
    assert "allowed by" in check_not_worse_than_classifier(_metadata(7 / 18, 14 / 18), allow=True)
    # not worse, or not recorded (a checkpoint that train did not write): nothing to say
    for quiet in (_metadata(14 / 18, 14 / 18), _metadata(0.9, 0.5, None), None, {}):
        assert worse_than_classifier(quiet) is None
        assert check_not_worse_than_classifier(quiet, allow=False) is None


@pytest.fixture(scope="module")
def worse_denoiser(tmp_path_factory, classifier_dir):
    """A real tiny training run that ends worse than no denoiser, with train's stderr."""
    from transdenoiser.cli import main

    out = tmp_path_factory.mktemp("worse") / "denoiser"
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main([*TRAIN, "--classifier", str(classifier_dir), "--out", str(out)]) == 0
    return out, err.getvalue()


def _not_worse_copy(denoiser, root):
    """The same weights with the classifier-alone figure recorded equal to the denoiser's: not worse."""
    copy = root / "not_worse"
    shutil.copytree(denoiser, copy)
    meta = json.loads((copy / "metadata.json").read_text())
    meta["baselines"]["accuracy_noisy_no_denoiser"] = meta["metrics"][-1]["accuracy_denoised"]
    (copy / "metadata.json").write_text(json.dumps(meta))
    return copy


def test_train_warns_on_a_worse_denoiser(worse_denoiser):
    out, err = worse_denoiser
    versus = worse_than_classifier(json.loads((out / "metadata.json").read_text()))
    assert versus is not None and versus.images == 60 and versus.without_denoiser > versus.with_denoiser + 0.3
    assert f"WARNING: denoiser {out} makes the classifier LESS accurate" in err
    assert f"with denoiser {versus.with_denoiser:.4f}; without {versus.without_denoiser:.4f}" in err
    assert "too little private data for this epsilon: 32 private examples" in err and "too few steps" in err


def test_train_is_silent_when_the_denoiser_is_not_worse(tmp_path, classifier_dir, monkeypatch, capsys):
    """The same run with the classifier alone recorded at accuracy 0 under noise: nothing is worse, nothing said."""
    import training.private_train as private_train

    real = private_train.classifier_baselines
    monkeypatch.setattr(private_train, "classifier_baselines",
                        lambda *a, **k: {**real(*a, **k), "accuracy_noisy_no_denoiser": 0.0})
    code, _, err = run_cli([*TRAIN, "--classifier", classifier_dir, "--out", tmp_path / "d"], capsys)
    assert code == 0 and "without 0.0000" not in err and "LESS accurate" not in err


def test_certify_warns_at_the_start_and_after_the_figures(worse_denoiser, classifier_dir, tmp_path, capsys):
    denoiser, _ = worse_denoiser
    certify = ["certify", "--classifier", classifier_dir, "--sigma", "0.25", "--n0", "10", "--n", "20",
               "--max-index", "2", "--device", "cpu"]
    code, _, err = run_cli([*certify, "--denoiser", denoiser, "--out", tmp_path / "c"], capsys)
    assert code == 0 and err.count("makes the classifier LESS accurate") == 2, err
    code, _, err = run_cli([*certify, "--denoiser", _not_worse_copy(denoiser, tmp_path), "--out", tmp_path / "q"],
                           capsys)
    assert code == 0 and "LESS accurate" not in err


def test_bundle_refuses_a_worse_denoiser_unless_allowed_and_the_card_records_it(worse_denoiser, classifier_dir,
                                                                                tmp_path, capsys):
    from serving.bundle import load_model_dir, write_model_dir
    from serving.card import model_card
    from transdenoiser.toml import tomllib

    denoiser, _ = worse_denoiser
    bundle = ["bundle", "--classifier", classifier_dir, "--denoiser", denoiser]
    code, _, err = run_cli([*bundle, "--out", tmp_path / "refused"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and ALLOW_WORSE_FLAG in err and "with denoiser" in err
    assert not (tmp_path / "refused").exists()
    # the Python API writes what it is given (its caller may run check_not_worse_than_classifier first); serve warns
    api = write_model_dir(tmp_path / "api", classifier_dir, denoiser, sigma=0.25)
    code, _, err = run_cli(serve_dry_run(api), capsys)
    assert code == 0 and f"WARNING: {api}'s denoiser makes the classifier LESS accurate" in err

    code, _, err = run_cli([*bundle, ALLOW_WORSE_FLAG, "--out", tmp_path / "allowed"], capsys)
    assert code == 0 and "LESS accurate" in err and f"allowed by {ALLOW_WORSE_FLAG}" in err
    assert tomllib.loads((tmp_path / "allowed" / "serving.toml").read_text())["allow_worse_than_classifier"] is True
    card = model_card(load_model_dir(tmp_path / "allowed"), "cpu", "off")["denoiser"]["versus_classifier_alone"]
    assert card["allow_worse_than_classifier"] is True and card["worse_than_classifier"] is True
    assert card["accuracy_with_denoiser"] < card["accuracy_without_denoiser"] and card["images"] == 60

    code, _, err = run_cli(["bundle", "--classifier", classifier_dir, "--denoiser",
                            _not_worse_copy(denoiser, tmp_path), "--out", tmp_path / "quiet"], capsys)
    assert code == 0 and "LESS accurate" not in err
    config = tomllib.loads((tmp_path / "quiet" / "serving.toml").read_text())
    assert config["allow_worse_than_classifier"] is False
    card = model_card(load_model_dir(tmp_path / "quiet"), "cpu", "off")["denoiser"]["versus_classifier_alone"]
    assert card["worse_than_classifier"] is False and card["allow_worse_than_classifier"] is False


def test_a_batch_larger_than_the_private_split_is_refused_naming_the_flag(random_classifier_dir, tmp_path, capsys):
    """A small folder's private split (here 8 examples) with the default batch of 64: one line that says which flag
    to change, with the largest value that works."""
    code, _, err = run_cli(["train", "--arm", "sepdp", "--denoiser", "tiny", "--train-examples", "8", "--device", "cpu",
                            "--classifier", random_classifier_dir, "--out", tmp_path / "d"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "batch size 64 exceeds the 8 private training examples" in err and "--batch-size 8 or less" in err
