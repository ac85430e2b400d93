"""``privacy-audit``'s training settings are built as ``train`` builds them (training/train_flags.py): one flag, one
field of the arm's config; a flag the arm does not use is refused in one line, a shared --config file's keys of
other arms are noted, a baseline arm is refused, and ``batch_size = "auto"`` is planned for the target epsilon."""
from __future__ import annotations

import json
from dataclasses import fields

import pytest

from transdenoiser.cli import build_parser, main

TINY = ["--denoiser", "tiny", "--denoiser-width", "8", "--activation", "silu", "--train-examples", "100",
        "--epochs", "1", "--eval-examples", "50", "--lr", "0.05", "--device", "cpu"]
# a flag of privacy-audit that the arm does not read (transdenoiser reads every training flag privacy-audit has)
FOREIGN = {"nodp": (["--xi-up", "3"], "--xi-up"), "sepdp": (["--xi-low", "0.3"], "--xi-low"),
           "recipe": (["--target-epsilon", "1", "--max-smin-dim", "10"], "--max-smin-dim")}
SHARED = "sigma = 0.25\nclip_norm = 1.0\nxi_up = 2.0\nxi_low = 0.3\nmax_smin_dim = 100\nnoise_draws = 1\n"


def _audit(words):
    return main(["privacy-audit", *words])


@pytest.mark.parametrize("arm", sorted(FOREIGN))
def test_privacy_audit_refuses_a_flag_the_arm_does_not_use_in_one_line(arm, tmp_path, capsys):
    flag, spelled = FOREIGN[arm]
    assert _audit(["--classifier", str(tmp_path), "--out", str(tmp_path / "o"), "--arm", arm, *flag, *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith(f"--arm {arm} does not take {spelled}"), err
    assert not (tmp_path / "o").exists()


def test_every_training_flag_of_privacy_audit_is_a_setting_of_the_transdenoiser_arm():
    """So that transdenoiser (the default arm) never refuses one: each flag sets a field of its config type."""
    import argparse

    from training.methods.denoiser_config import TransDenoiserConfig
    from training.train_flags import DENOISER_KWARG_FLAGS, FLAG_FIELDS

    parser = build_parser(["privacy-audit", "--help"])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["privacy-audit"]
    group = next(g for g in sub._action_groups if g.title == "training (as for `train`)")
    dests = {action.dest for action in group._group_actions} - {"arm"}
    assert dests and dests <= set(FLAG_FIELDS) | set(DENOISER_KWARG_FLAGS)
    own = {f.name for f in fields(TransDenoiserConfig)}
    assert {FLAG_FIELDS.get(dest, "denoiser_kwargs") for dest in dests} <= own


NOTES = {"nodp": "arm nodp does not use clip_norm, xi_up (sepdp's and transdenoiser's settings), max_smin_dim, "
                 "xi_low (transdenoiser's settings), noise_draws (sepdp's setting)",
         "sepdp": "arm sepdp does not use max_smin_dim, xi_low (transdenoiser's settings)",
         "transdenoiser": "arm transdenoiser does not use noise_draws (sepdp's setting)"}


@pytest.mark.parametrize("arm", sorted(NOTES))
def test_a_shared_config_files_other_arm_keys_are_noted_not_refused(arm, tmp_path, capsys):
    from training.audit.cli import _config

    path = tmp_path / "shared.toml"
    path.write_text(SHARED)
    args = build_parser().parse_args(["privacy-audit", "--config", str(path), "--arm", arm, "--classifier",
                                      str(tmp_path), "--out", str(tmp_path / "o"), "--seed", "4"])
    _, config = _config(args)
    assert capsys.readouterr().err.splitlines() == [f"note: --config {path}: {NOTES[arm]}"]
    run = config.train_config()  # what the audit trains with: the file's values recorded, as train records them
    assert (run.arm, run.sigma, run.xi_up, run.xi_low, run.max_smin_dim, run.seed) == (arm, 0.25, 2.0, 0.3, 100, 4)


def test_a_baseline_arm_in_the_config_file_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "stobatch.toml"
    path.write_text('arm = "stobatch"\nepochs = 2\n')
    assert _audit(["--config", str(path), "--classifier", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith(
        f"privacy-audit takes --arm nodp|sepdp|transdenoiser|recipe; --config {path} says arm = 'stobatch'"), err
    assert not (tmp_path / "o").exists()


def test_the_recipe_is_audited_as_the_sepdp_run_it_is(tmp_path):
    from training.audit.cli import _config
    from training.methods.denoiser_config import RecipeConfig

    args = build_parser().parse_args(["privacy-audit", "--arm", "recipe", "--target-epsilon", "2", "--classifier",
                                      str(tmp_path), "--out", str(tmp_path / "o")])
    method, config = _config(args)
    assert method.name == "recipe" and isinstance(config, RecipeConfig) and config.batch_size == "auto"
    config.batch_size = 64
    run = config.train_config()
    assert (run.arm, run.optimizer, run.learning_rate, run.target_epsilon) == ("sepdp", "adam", 3e-3, 2.0)


def test_batch_size_auto_from_a_config_file_needs_a_target_epsilon_and_a_dp_arm(tmp_path, capsys):
    path = tmp_path / "auto.toml"
    path.write_text('batch_size = "auto"\n')
    for arm in (["--arm", "nodp"], ["--arm", "sepdp"]):
        assert _audit(["--config", str(path), *arm, "--classifier", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and 'batch_size = "auto" is planned for a target epsilon' in err, err


def test_batch_size_auto_from_a_config_file_is_planned_for_the_target_epsilon(tmp_path, capsys, monkeypatch,
                                                                             random_classifier_dir):
    from training.privacy.consistency import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    path = tmp_path / "auto.toml"
    path.write_text('batch_size = "auto"\ntarget_epsilon = 4.0\n')
    out = tmp_path / "audit"
    code = _audit(["--config", str(path), "--arm", "sepdp", "--classifier", str(random_classifier_dir), "--out",
                   str(out), *TINY, "--train-examples", "40", "--canaries", "50", "--no-membership",
                   "--null-simulations", "99", "--reproducible-noise"])
    err = capsys.readouterr().err
    assert code == 0, err
    chosen = [line.split()[0] for line in err.splitlines() if line.endswith("<- chosen")]
    assert chosen == ["40"]  # 40 examples, fewer than the smallest candidate (64): the whole split, q = 1 (quick)
    recorded = json.loads((out / "model" / "metadata.json").read_text())["config"]
    assert recorded["batch_size"] == 40 and recorded["target_epsilon"] == 4.0 and recorded["arm"] == "sepdp"
