"""The tuned recipe as a training method, ``recipe`` (training/methods/recipe.py): its config type holds sepdp's
settings with the recipe's defaults and refuses the rest, it needs a target epsilon, and a run is the explicit sepdp
run with the same settings, byte for byte."""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from training.methods import Method, SettingsSource, get_method
from transdenoiser.cli import main
from transdenoiser.errors import UserError
from transdenoiser.toml import read_toml

ROOT = Path(__file__).resolve().parents[1]
FLAGS = SettingsSource("flags", {"xi_low": "--xi-low", "xi_up": "--xi-up", "target_epsilon": "--target-epsilon"})


def test_recipe_is_a_registered_method_over_sepdp():
    from training.choices import ARMS
    from training.methods.denoiser_config import RecipeConfig

    method = get_method("recipe")
    assert isinstance(method, Method) and method.name == "recipe" and method.config_type is RecipeConfig
    assert method.certificate is None and "recipe" in ARMS
    config = method.config_from_settings({"target_epsilon": 2.0}, FLAGS)
    assert isinstance(config, RecipeConfig) and config.arm == "sepdp"
    assert (config.batch_size, config.optimizer, config.learning_rate, config.ema_decay, config.min_steps) == (
        "auto", "adam", 3e-3, 0.0, 200)


def test_recipe_config_is_sepdps_settings_less_xi_up_with_the_committed_recipes_choices():
    from training.methods.denoiser_config import RecipeConfig, SepDPConfig

    assert {f.name for f in fields(RecipeConfig)} == {f.name for f in fields(SepDPConfig)} - {"xi_up"}
    defaults = RecipeConfig()
    for path in sorted((ROOT / "configs").glob("recipe_*.toml")):  # the sweep's winners choose these settings
        chosen = read_toml(path, "--config")
        assert chosen["arm"] == defaults.arm, path
        assert (chosen["optimizer"], chosen["learning_rate"], chosen["ema_decay"], chosen["objective"]) == (
            defaults.optimizer, defaults.learning_rate, defaults.ema_decay, defaults.objective), path
    assert defaults.objective == "stability+mse"  # the objective that certified most at equal epsilon


@pytest.mark.parametrize(("settings", "message"), [
    ({"target_epsilon": 1.0, "xi_low": 0.3}, "--arm recipe does not take --xi-low"),
    ({"target_epsilon": 1.0, "xi_up": 2.0}, "--arm recipe does not take --xi-up"),
    ({"epochs": 2}, "--arm recipe needs --target-epsilon"),
])
def test_recipe_refuses_what_it_does_not_read_and_a_missing_target_epsilon_in_one_line(settings, message):
    with pytest.raises(UserError) as error:
        get_method("recipe").config_from_settings(settings, FLAGS)
    assert len(str(error.value).splitlines()) == 1 and str(error.value).startswith(message)


def test_a_shared_config_files_xi_up_is_noted_for_the_recipe_not_refused():
    from training.methods.denoiser_config import unused_note

    method = get_method("recipe")
    source = SettingsSource("run.toml", {"xi_up": "xi_up (in --config run.toml)"}, frozenset({"xi_up"}), "run.toml")
    settings = {"xi_up": 3.0, "target_epsilon": 1.0}
    assert unused_note("recipe", method.unused_settings(settings, source)) == (
        "arm recipe does not use xi_up (sepdp's and transdenoiser's setting)")
    config = method.config_from_settings(settings, source)
    config.batch_size = 32
    assert config.train_config().xi_up == 3.0  # recorded as given, as a sepdp run records it


def test_train_recipe_plan_prints_the_plan_and_what_the_recipe_chose(capsys):
    assert main(["train", "--arm", "recipe", "--target-epsilon", "1", "--epochs", "2", "--train-examples", "128",
                 "--plan"]) == 0
    out = capsys.readouterr().out
    assert "batch sizes for target epsilon 1 at delta 1e-05 (rdp accountant), 2 epochs, at least 200 steps" in out
    chosen = [line.split()[0] for line in out.splitlines() if line.endswith("<- chosen")]
    assert chosen == ["64"]  # 128 examples, 2 epochs: B = 64 leaves 4 steps, fewer than 200: the smallest
    assert out.strip().splitlines()[-1] == (
        "recipe: sepdp, batch 64 planned for epsilon 1 (rdp accountant, delta 1e-05), adam lr 0.003, "
        "no parameter averaging, objective stability+mse")
    assert main(["train", "--arm", "recipe", "--target-epsilon", "1", "--epochs", "2", "--train-examples", "128",
                 "--batch-size", "128", "--ema", "0.99", "--objective", "mse", "--plan"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == (  # the plan, and the batch size given is kept
        "recipe: sepdp, batch 128 at epsilon 1 (rdp accountant, delta 1e-05), adam lr 0.003, EMA decay 0.99, "
        "objective mse")


def _train(words, out, capsys):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = main(["train", *words, "--denoiser", "tiny", "--denoiser-width", "2", "--train-examples", "32",
                     "--eval-examples", "8", "--epochs", "1", "--clipping", "vmap", "--reproducible-noise",
                     "--seed", "3", "--out", str(out), "--device", "cpu"])
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert code == 0, err
    return err


def test_a_recipe_run_is_the_explicit_sepdp_run_byte_for_byte(tmp_path, capsys, random_classifier_dir):
    config = tmp_path / "recipe.toml"
    config.write_text('arm = "recipe"\ntarget_epsilon = 2.0\n')
    recipe_err = _train(["--config", str(config), "--classifier", str(random_classifier_dir)], tmp_path / "recipe",
                        capsys)
    _train(["--arm", "sepdp", "--target-epsilon", "2", "--batch-size", "auto", "--optimizer", "adam", "--lr", "3e-3",
            "--objective", "stability+mse", "--classifier", str(random_classifier_dir)], tmp_path / "sepdp", capsys)
    assert "recipe: sepdp, batch 32 planned for epsilon 2" in recipe_err
    released = sorted(p.name for p in (tmp_path / "sepdp").iterdir() if p.is_file())
    assert {"metadata.json", "privacy_report.txt"} < set(released) and any("weights" in n or n.endswith(
        (".pt", ".safetensors")) for n in released), released
    for name in released:
        assert (tmp_path / "recipe" / name).read_bytes() == (tmp_path / "sepdp" / name).read_bytes(), name
    recorded = json.loads((tmp_path / "recipe" / "metadata.json").read_text())["config"]
    assert recorded["arm"] == "sepdp" and recorded["batch_size"] == 32 and recorded["optimizer"] == "adam"
    assert recorded["objective"] == "stability+mse"
