"""The tuned DP recipe (issue 14, item 4): parameter averaging, no BatchNorm in the DP arms, batch sizes planned
for a target epsilon, and the sweep whose every run spends that epsilon."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import training.private_train as private_train
from training.checkpoint import load_checkpoint
from training.models import build_model
from training.private_train import train_denoiser
from training.recipe import batch_norm_to_group_norm, choose_batch_size, plan_batch_sizes, refuse_batch_norm
from training.train_config import TrainConfig, load_config_file
from transdenoiser.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def _config(**overrides) -> TrainConfig:
    values = {"arm": "sepdp", "denoiser": "tiny", "denoiser_kwargs": {"width": 4}, "activation": "silu",
              "train_examples": 96, "eval_examples": 50, "batch_size": 24, "epochs": 2, "xi_up": 1.0,
              "optimizer": "sgd", "learning_rate": 0.05, "reproducible_noise": True, "seed": 3, "ema_decay": 0.9}
    values.update(overrides)
    return TrainConfig(**values)


def _recording_optimizer(trajectory: list):
    """Wrap private_train.build_optimizer: record the live weights at creation and after every optimiser step."""
    original = private_train.build_optimizer

    def make(config, model):
        optimizer = original(config, model)
        snapshot = lambda: {k: v.detach().clone().double() for k, v in model.named_parameters()}  # noqa: E731
        trajectory.append(snapshot())
        optimizer.register_step_post_hook(lambda *_: trajectory.append(snapshot()))
        return optimizer

    return make


def test_ema_equals_an_independent_recomputation(mnist10k, random_classifier_dir, tmp_path, monkeypatch):
    """The released weights are the EMA of the live iterates (recomputed here from the recorded trajectory with
    the documented warm-up decay min(d, (1+t)/(10+t))); the live iterates are those of a run without averaging
    (post-processing only); and a run interrupted after one epoch and resumed releases the same average."""
    classifier = load_checkpoint(random_classifier_dir, kind="classifier")
    trajectory: list = []
    monkeypatch.setattr(private_train, "build_optimizer", _recording_optimizer(trajectory))
    model, meta = train_denoiser(_config(), mnist10k, classifier, torch.device("cpu"), checkpoint_dir=tmp_path / "a")
    steps = meta["steps_done"]
    assert steps == 8 and len(trajectory) == steps + 1
    decay = 0.9
    expected = {k: v.clone() for k, v in trajectory[0].items()}
    for t, weights in enumerate(trajectory[1:]):
        d = min(decay, (1 + t) / (10 + t))
        expected = {k: d * expected[k] + (1 - d) * weights[k] for k in expected}
    released = load_checkpoint(tmp_path / "a", kind="denoiser").model
    differs_from_live = False
    for name, p in released.named_parameters():
        assert torch.allclose(p.double(), expected[name], atol=1e-6), name
        assert torch.equal(p, dict(model.named_parameters())[name])
        differs_from_live |= not torch.allclose(p.double(), trajectory[-1][name], atol=1e-4)
    assert differs_from_live  # the average is not simply the last iterate

    monkeypatch.undo()
    plain, _ = train_denoiser(_config(ema_decay=0.0), mnist10k, classifier, torch.device("cpu"))
    for name, p in plain.named_parameters():  # averaging does not change the optimisation
        assert torch.allclose(p.double(), trajectory[-1][name], atol=1e-6), name

    train_denoiser(_config(), mnist10k, classifier, torch.device("cpu"), checkpoint_dir=tmp_path / "b",
                   stop_after_epochs=1)
    resumed, _ = train_denoiser(_config(), mnist10k, classifier, torch.device("cpu"), checkpoint_dir=tmp_path / "b",
                                resume=True)
    for name, p in resumed.named_parameters():
        assert torch.allclose(p.double(), expected[name], atol=1e-6), name


class _BatchNormDenoiser(nn.Module):
    def __init__(self, **_):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                 nn.Conv2d(4, 1, 3, padding=1))

    def forward(self, z):
        return torch.sigmoid(self.net(z))


def _output_alone_and_in_batch(model, x):
    """Example 0's output computed alone and as part of the batch ``x`` (train mode, as in training)."""
    model.train()
    with torch.no_grad():
        return model(x[:1])[0], model(x)[0]


def test_dp_arms_refuse_batch_norm_and_group_norm_is_per_example(mnist10k, random_classifier_dir, monkeypatch):
    classifier = load_checkpoint(random_classifier_dir, kind="classifier")
    monkeypatch.setattr(private_train, "build_model", lambda name, **kw: _BatchNormDenoiser())
    for arm in ("sepdp", "transdenoiser"):
        with pytest.raises(UserError, match="BatchNorm"):
            train_denoiser(_config(arm=arm, ema_decay=0.0), mnist10k, classifier, torch.device("cpu"))
    with pytest.raises(UserError, match="BatchNorm"):
        refuse_batch_norm(_BatchNormDenoiser(), "sepdp")
    for name in ("autoencoder", "dncnn"):
        with pytest.raises(UserError, match="BatchNorm"):
            build_model(name, norm="batch")
    refuse_batch_norm(build_model("autoencoder", norm="group"), "sepdp")  # GroupNorm passes
    assert any(isinstance(m, nn.GroupNorm) for m in build_model("autoencoder", norm="group").modules())

    # why: with BatchNorm an example's output (so its gradient) depends on the rest of the batch, and the running
    # statistics are an un-noised function of the private batch; after the conversion neither holds
    torch.manual_seed(0)
    x = mnist10k.private.tensors()[0][:6]
    model = _BatchNormDenoiser()
    alone, in_batch = _output_alone_and_in_batch(model, x)
    assert not torch.allclose(alone, in_batch, atol=1e-4)
    converted = batch_norm_to_group_norm(model, groups=2)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in converted.modules())
    assert not list(converted.buffers())
    refuse_batch_norm(converted, "sepdp")
    alone, in_batch = _output_alone_and_in_batch(converted, x)
    assert torch.allclose(alone, in_batch, atol=1e-5)


@pytest.mark.parametrize("target,epochs,num_examples,sizes", [(1.0, 10, 30000, [64, 1024]), (8.0, 5, 2998, [256])])
def test_planned_runs_land_at_the_target_epsilon(target, epochs, num_examples, sizes):
    """Each plan's noise multiplier, put through dp-accounting's RDP accountant directly (Poisson-sampled Gaussian,
    composed T times), gives an epsilon in [0.99 target, target]; T is the training loop's epochs x round(N/B); and
    the choice is the largest batch with enough steps (brute force)."""
    import dp_accounting

    delta = 1e-5
    plans = plan_batch_sizes(target, delta, num_examples, epochs, batch_sizes=sizes)
    for plan in plans:
        q = plan.batch_size / num_examples
        assert plan.steps == epochs * round(num_examples / plan.batch_size)
        accountant = dp_accounting.rdp.RdpAccountant()
        accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(plan.noise_multiplier)),
                           plan.steps)
        epsilon = accountant.get_epsilon(delta)
        assert 0.99 * target <= epsilon <= target, (plan, epsilon)
        assert plan.mean_noise == pytest.approx(plan.noise_multiplier / plan.batch_size)
    for min_steps in (1, 100, 500, 10 ** 6):
        enough = [p.batch_size for p in plans if p.steps >= min_steps]
        assert choose_batch_size(plans, min_steps).batch_size == (max(enough) if enough else min(sizes))


def test_cli_batch_size_auto_needs_a_target_epsilon(tmp_path):
    from transdenoiser import cli

    assert cli.main(["train", "--plan", "--arm", "sepdp", "--out", str(tmp_path / "x")]) == 2
    assert cli.main(["train", "--batch-size", "auto", "--arm", "nodp", "--classifier",
                     str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_plan_needs_no_out_and_training_without_out_is_one_line(tmp_path, capsys, monkeypatch):
    """`train --plan` trains and writes nothing, so it takes no --out (as the recipe configs document); a training
    without --out is refused in one line naming the flag."""
    from transdenoiser import cli

    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--plan", "--arm", "sepdp", "--target-epsilon", "1", "--epochs", "5"]) == 0
    out = capsys.readouterr().out
    assert "<- chosen" in out and list(tmp_path.iterdir()) == []
    assert cli.main(["train", "--arm", "sepdp", "--classifier", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--out is required" in err


def test_sweep_quick_runs_every_run_at_the_target(random_classifier_dir, tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "sweep_recipe.py"), "--quick", "--classifier",
                             str(random_classifier_dir), "--out", str(tmp_path / "sweep"),
                             "--write-config", str(tmp_path / "best.toml")],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    import json

    summary = json.loads((tmp_path / "sweep" / "results.json").read_text())
    assert len(summary["runs"]) == 2
    for run in summary["runs"]:
        assert 0.99 * summary["target_epsilon"] <= run["epsilon_rdp"] <= summary["target_epsilon"]
    config = load_config_file(tmp_path / "best.toml")
    assert config.target_epsilon == summary["target_epsilon"] and config.arm == "sepdp"
    assert config.ema_decay == summary["best"]["ema_decay"]
    assert np.isfinite(summary["best"]["validation_mse"])
    before = (tmp_path / "best.toml").read_bytes()
    again = subprocess.run([sys.executable, str(ROOT / "scripts" / "sweep_recipe.py"), "--quick", "--classifier",
                            str(random_classifier_dir), "--out", str(tmp_path / "sweep2"),
                            "--write-config", str(tmp_path / "best.toml")],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert again.returncode == 2 and "nothing is overwritten" in again.stderr
    assert (tmp_path / "best.toml").read_bytes() == before and not (tmp_path / "sweep2").exists()


def _fake_arm(root: Path, arm: str, certified_at_half: set[int], images: int) -> None:
    """An arm's released metadata and certification rows: images in ``certified_at_half`` are correct with radius
    0.6, the others wrong (radius 0)."""
    import json

    (root / "train" / arm).mkdir(parents=True)
    (root / "train" / arm / "metadata.json").write_text(json.dumps(
        {"metrics": [{"accuracy_denoised": 0.5}], "privacy": {"guarantees": []}, "config": {}}))
    run = root / "cert500" / arm
    run.mkdir(parents=True)
    rows = ["idx\tlabel\tpredict\tradius\tcorrect\ttime"]
    rows += [f"{i}\t0\t0\t0.600000\t1\t0.1" if i in certified_at_half else f"{i}\t0\t1\t0.000000\t0\t0.1"
             for i in range(images)]
    (run / "certify.tsv").write_text("\n".join(rows) + "\n")
    share = len(certified_at_half) / images
    (run / "summary.json").write_text(json.dumps(
        {"certified_accuracy": [{"radius": r, "certified_accuracy": share if r <= 0.6 else 0.0}
                                for r in (0.0, 0.25, 0.5, 0.75, 1.0)],
         "average_certified_radius": 0.6 * share, "images": images, "n": 10_000}))


def test_recipe_table_paired_margin_is_the_targets_statistic(tmp_path):
    """sepdp certifies 100 of 200 images at 0.5, nodp 150, the recipe 140 (the same 100 plus 40): the recipe closes
    exactly 80% of the gap, so the target's margin is 0 and its paired interval straddles 0; it is +20 points over
    sepdp at r = 0.5 with a paired interval that excludes 0 (it never loses an image)."""
    _fake_arm(tmp_path, "sepdp", set(range(100)), 200)
    _fake_arm(tmp_path, "nodp", set(range(150)), 200)
    _fake_arm(tmp_path, "recipe_full", set(range(140)), 200)
    done = subprocess.run([sys.executable, "scripts/recipe_table.py", str(tmp_path), "--cert", "cert500", "--paired"],
                          capture_output=True, text=True, check=True)
    line = next(x for x in done.stdout.splitlines() if x.startswith("| new recipe") and "[" in x)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3].startswith("+20.0 [")  # r = 0.5
    low, high = (float(v) for v in cells[3].split("[")[1].rstrip("]").split(","))
    assert 0 < low < 20 < high
    assert cells[-1].startswith("80%; margin +0.0 [") or cells[-1].startswith("80%; margin -0.0 [")
    margin_low, margin_high = (float(v) for v in cells[-1].split("[")[1].rstrip("]").split(","))
    assert margin_low < 0 < margin_high
    bad = subprocess.run([sys.executable, "scripts/recipe_table.py", str(tmp_path), "--cert", "nothing"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no certified arm" in bad.stderr


def _fake_transdenoiser(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for the CLI that logs each call to calls.txt and marks its --out complete (train) or certified
    (certify): (the script, the log)."""
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "transdenoiser"
    fake.write_text("#!/usr/bin/env bash\n"
                    f'echo "$*" >> {calls}\n'
                    'out=""; prev=""; for a in "$@"; do [ "$prev" = --out ] && out=$a; prev=$a; done\n'
                    'mkdir -p "$out"\n'
                    '[ "$1" = train ] && echo \'{"complete": true}\' > "$out/metadata.json"\n'
                    '[ "$1" = certify ] && echo "{}" > "$out/summary.json"\n'
                    "exit 0\n")
    fake.chmod(0o755)
    return fake, calls


def test_measure_recipe_resumes_an_interrupted_training_and_skips_a_complete_one(tmp_path):
    """scripts/measure_recipe.sh trains an arm from scratch, continues an interrupted one with --resume (train refuses
    an existing checkpoint without it), and neither retrains a complete arm nor recertifies a certified one."""
    fake, calls = _fake_transdenoiser(tmp_path)
    out = tmp_path / "run"
    (out / "train" / "sepdp").mkdir(parents=True)
    (out / "train" / "sepdp" / "metadata.json").write_text('{"complete": false, "epochs_done": 3}')
    (out / "train" / "nodp").mkdir(parents=True)
    (out / "train" / "nodp" / "metadata.json").write_text('{"complete": true}')
    (out / "cert" / "nodp").mkdir(parents=True)
    (out / "cert" / "nodp" / "summary.json").write_text("{}")
    env = {**os.environ, "TRANSDENOISER": str(fake), "PYTHON": sys.executable}
    done = subprocess.run(["bash", "scripts/measure_recipe.sh", "mnist10k", "0.5", "1", "clf", "recipe.toml", str(out),
                           "10", "100", "nodp", "sepdp", "transdenoiser"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    lines = calls.read_text().splitlines()
    trains = {line.split("--out ")[1].split()[0].rsplit("/", 1)[1]: line for line in lines if line.startswith("train")}
    certifies = [line.split("--out ")[1].split()[0].rsplit("/", 1)[1] for line in lines if line.startswith("certify")]
    assert sorted(trains) == ["sepdp", "transdenoiser"]  # nodp is complete: not retrained
    assert "--resume" in trains["sepdp"].split() and "--resume" not in trains["transdenoiser"].split()
    assert sorted(certifies) == ["sepdp", "transdenoiser"]  # nodp is certified: not recertified
    assert all("--skip 200 --max-index 2000" in line for line in lines if line.startswith("certify"))  # 10 of 2,004


def _fake_objective_row(root: Path, arm: str, certified_at_half: set[int], images: int, trained: bool = True) -> None:
    """scripts/objective_table.py's layout: train/ARM (absent for the references) and cert/ARM."""
    import json

    _fake_arm(root, arm, certified_at_half, images)
    (root / "cert").mkdir(exist_ok=True)
    (root / "cert500" / arm).rename(root / "cert" / arm)
    summary_path = root / "cert" / arm / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary.update(mode="estimate", samples_per_image={"mean": 7000.0}, max_certifiable_radius=0.7917689787)
    summary_path.write_text(json.dumps(summary))
    meta = root / "train" / arm / "metadata.json"
    if trained:
        meta.write_text(json.dumps({"objective": "stability+mse", "privacy": {"guarantees": [
            {"name": "sepdp", "epsilon": {"rdp": 0.998}}]}}))
    else:
        meta.unlink()
        meta.parent.rmdir()


def test_objective_table_gives_paired_differences_and_the_share_of_the_gap_to_retrain_closed(tmp_path):
    """The MSE recipe certifies 100 of 200 images at 0.5, the retrain reference 160, stability+mse 130 (the same
    100 plus 30): it is +15 points over the MSE recipe, with a paired interval excluding 0, and closes 50% of the
    gap to the retrain reference; the classifier alone (40) is -30, a reference with no share of its own."""
    _fake_objective_row(tmp_path, "recipe_full", set(range(100)), 200)
    _fake_objective_row(tmp_path, "recipe_stability_mse", set(range(130)), 200)
    _fake_objective_row(tmp_path, "retrain", set(range(160)), 200, trained=False)
    _fake_objective_row(tmp_path, "none", set(range(40)), 200, trained=False)
    done = subprocess.run([sys.executable, "scripts/objective_table.py", str(tmp_path)],
                          capture_output=True, text=True, check=True, cwd=ROOT)
    rows: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():  # the main table's row (the table of differences below repeats labels)
        if line.startswith("| "):
            rows.setdefault(line.split("|")[1].strip(), [c.strip() for c in line.strip("|").split("|")])
    best = rows["recipe, stability+mse (public MSE, then stability)"]
    assert best[1] == "0.998 (DP-SGD, RDP)" and best[4] == "65.0%"
    assert best[-2].startswith("+15.0 [") and float(best[-2].split("[")[1].split(",")[0]) > 0
    assert best[-1].startswith("50% [")
    alone = rows["reference: no denoiser (classifier alone)"]
    assert alone[1] == "no private data" and alone[-2].startswith("-30.0 [") and alone[-1] == ""  # a reference
    assert rows["recipe, mse (public MSE initialisation)"][-2] == "-"
    assert ("- recipe, mse (public MSE initialisation): adaptive estimate, n_max 10,000, mean 7,000 samples per "
            "image, largest certifiable radius 0.792") in done.stdout.splitlines()  # radii past it read 0
    (tmp_path / "cert" / "retrain" / "certify.tsv").write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\n"
                                                               "0\t0\t0\t0.6\t1\t0.1\n")
    bad = subprocess.run([sys.executable, "scripts/objective_table.py", str(tmp_path)], capture_output=True,
                         text=True, cwd=ROOT)
    assert bad.returncode == 2 and "retrain is not certified on the MSE recipe's 200 images" in bad.stderr


def test_measure_recipe_certifies_the_references_alone_and_passes_each_objective(tmp_path):
    """none and retrain certify a classifier with no denoiser (retrain: $RETRAIN_CLASSIFIER); recipe_OBJECTIVE and
    nodp_OBJECTIVE train with --objective, recipe_full with mse; stability_mse starts from the public
    initialisation; CERTIFY_FLAGS reach every certify."""
    fake, calls = _fake_transdenoiser(tmp_path)
    out = tmp_path / "run"
    env = {**os.environ, "TRANSDENOISER": str(fake), "PYTHON": sys.executable, "RETRAIN_CLASSIFIER": "noisy_clf",
           "CERTIFY_FLAGS": "--precision bf16"}
    done = subprocess.run(["bash", "scripts/measure_recipe.sh", "mnist10k", "0.5", "1", "clf", "recipe.toml", str(out),
                           "10", "estimate:100", "none", "retrain", "recipe_full", "recipe_stability",
                           "recipe_stability_mse", "nodp_classification"],
                           capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    lines = calls.read_text().splitlines()
    certifies = {line.split("--out ")[1].split()[0].rsplit("/", 1)[1]: line.split()
                 for line in lines if line.startswith("certify")}
    assert certifies["none"][1:3] == ["--classifier", "clf"] and "--denoiser" not in certifies["none"]
    assert certifies["retrain"][1:3] == ["--classifier", "noisy_clf"] and "--denoiser" not in certifies["retrain"]
    assert all(c[c.index("--precision") + 1] == "bf16" and "--adaptive" in c for c in certifies.values())
    trains = {line.split("--out ")[1].split()[0].rsplit("/", 1)[1]: line.split() for line in lines
              if line.startswith("train")}
    assert trains["recipe_stability"][trains["recipe_stability"].index("--objective") + 1] == "stability"
    assert "--init-from" not in trains["recipe_stability"]
    mixed = trains["recipe_stability_mse"]
    assert mixed[mixed.index("--objective") + 1] == "stability+mse"
    assert mixed[mixed.index("--init-from") + 1].endswith("/train/public_init") and "public_init" in trains
    assert trains["nodp_classification"][trains["nodp_classification"].index("--objective") + 1] == "classification"
    # the MSE recipe stays MSE whatever the recipe's config file chooses
    assert trains["recipe_full"][trains["recipe_full"].index("--objective") + 1] == "mse"
    assert "nodp" in trains["nodp_classification"]
    missing = subprocess.run(["bash", "scripts/measure_recipe.sh", "mnist10k", "0.5", "1", "clf", "recipe.toml",
                              str(tmp_path / "other"), "10", "100", "retrain"], capture_output=True, text=True,
                             timeout=120, cwd=ROOT, env={k: v for k, v in env.items() if k != "RETRAIN_CLASSIFIER"})
    assert missing.returncode != 0 and "RETRAIN_CLASSIFIER" in missing.stderr
