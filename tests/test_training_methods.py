"""The training-method interface (training/methods): the registry, each method's config refusing the settings it
does not use (by its config type's fields), the train command going through the registry, and baseline-certify's
rows kept by the run directory certify uses (certify/rundir.py with certify/baseline_job.py's layout)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from training.methods import Hooks, SettingsSource, TrainResult, get_method, method_names, register, unregister
from transdenoiser.cli import build_parser, main
from transdenoiser.errors import UserError

FLAGS = SettingsSource("flags", {"xi_low": "--xi-low", "sigma": "--sigma", "robust_epsilon": "robust_epsilon "
                                 "(in --config run.toml)", "xi_up": "--xi-up"})


def test_the_registry_knows_every_arm_and_names_them_on_an_unknown_one():
    names = method_names()
    assert names[:7] == ("nodp", "sepdp", "transdenoiser", "recipe", "securesgd-prt", "securesgd-sct", "stobatch")
    for name in names[:7]:
        method = get_method(name)
        assert method.name == name
        assert (method.certificate is None) == (name in ("nodp", "sepdp", "transdenoiser", "recipe"))
    with pytest.raises(UserError) as error:
        get_method("sgd")
    message = str(error.value)
    assert len(message.splitlines()) == 1 and "'sgd'" in message and all(n in message for n in names[:7])


@pytest.mark.parametrize("name", ["securesgd-prt", "securesgd-sct", "stobatch"])
def test_a_baselines_config_refuses_xi_low_in_one_line(name):
    method = get_method(name)
    with pytest.raises(UserError) as error:
        method.config_from_settings({"xi_low": 0.5, "epochs": 2}, FLAGS)
    message = str(error.value)
    assert len(message.splitlines()) == 1 and f"--arm {name} does not take --xi-low" in message
    config = method.config_from_settings({"epochs": 2, "xi_up": 3.0}, FLAGS)  # the flag's name -> the config's own
    assert config.epochs == 2 and config.noise_multiplier == 3.0
    assert isinstance(config, method.config_type)


def test_the_denoiser_arms_refuse_a_baselines_setting_and_keep_their_records_plain():
    method = get_method("sepdp")
    with pytest.raises(UserError, match=r"^--arm sepdp does not take robust_epsilon \(in --config run.toml\)$"):
        method.config_from_settings({"robust_epsilon": 2.0}, FLAGS)
    config = method.config_from_settings({"batch_size": "auto", "target_epsilon": 2.0, "min_steps": 20,
                                          "epochs": 10}, FLAGS)
    assert config.arm == "sepdp" and config.batch_size == "auto"
    with pytest.raises(UserError, match="batch size auto"):  # planned from the data's size first (test_recipe.py)
        config.train_config()
    config.batch_size = 128
    assert "min_steps" not in asdict(config.train_config())  # checkpoints record the plain TrainConfig


def test_stobatch_takes_a_noise_multiplier_alone_and_a_flag_beats_the_config_file():
    method = get_method("stobatch")
    source = SettingsSource("run.toml", {"noise_multiplier": "noise_multiplier (in --config run.toml)",
                                         "xi_up": "--xi-up"})
    config = method.config_from_settings({"noise_multiplier": 2.0, "xi_up": 4.0}, source)
    assert config.noise_multiplier == 4.0 and config.target_epsilon is None


def test_train_refuses_a_flag_the_arm_does_not_use(tmp_path, capsys):
    assert main(["train", "--arm", "securesgd-sct", "--xi-low", "0.2", "--norm", "group", "--out",
                 str(tmp_path / "o"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--arm securesgd-sct does not take --norm, --xi-low" in err


@dataclass
class FakeConfig:
    epochs: int = 1
    seed: int = 0


class FakeMethod:
    """A method of a test: it 'trains' by counting epochs, and saves its config as JSON."""

    name = "fake-for-test"
    config_type = FakeConfig
    certificate = None
    resumable = False

    def __init__(self):
        self.trained = []

    def config_from_settings(self, settings, source, base=None):
        from training.methods.base import refuse_unknown

        refuse_unknown(self.name, FakeConfig, settings, source)
        return FakeConfig(**{**(base or {}), **settings})

    def check_run(self, *, resume=False, distributed=False):
        if resume:
            raise UserError("fake cannot resume")

    def plan(self, config, num_examples):
        return {"total_steps": config.epochs}

    def train(self, config, data, classifier, device, hooks=Hooks(), *, out=None, resume=False, group=None):
        for epoch in hooks.track(range(config.epochs), desc="fake", total=config.epochs):
            if hooks.on_epoch is not None:
                hooks.on_epoch({"epoch": epoch + 1, "images": len(data.private)})
        self.trained.append((config, data.name, classifier))
        return TrainResult(None, {"kind": "fake", "config": asdict(config)})

    def save(self, config, result, out):
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "fake.json").write_text(json.dumps(result.metadata))
        return Path(out)

    def load(self, out, device="cpu"):
        return json.loads((Path(out) / "fake.json").read_text())


def test_train_runs_a_registered_method_through_the_registry(tmp_path, capsys):
    from training.train_cli import cmd_train

    method = register(FakeMethod())
    try:
        assert "fake-for-test" in method_names() and get_method("fake-for-test") is method
        words = ["train", "--epochs", "3", "--seed", "5", "--out", str(tmp_path / "run"), "--device", "cpu"]
        args = build_parser(words).parse_args(words)
        args.arm = "fake-for-test"  # not an --arm choice of the parser: the CLI function takes any registered name
        assert cmd_train(args) == 0
        out = capsys.readouterr()
        assert out.out.strip() == f"trained fake-for-test: checkpoint {tmp_path / 'run'}"
        assert out.err.count("images ") == 3
        (config, data_name, classifier), = method.trained
        assert config == FakeConfig(epochs=3, seed=5) and data_name == "mnist10k" and classifier is None
        assert method.load(tmp_path / "run")["config"] == {"epochs": 3, "seed": 5}
        words = ["train", "--xi-low", "0.1", "--out", str(tmp_path / "other"), "--device", "cpu"]
        args = build_parser(words).parse_args(words)
        args.arm = "fake-for-test"
        with pytest.raises(UserError, match="^--arm fake-for-test does not take --xi-low$"):
            cmd_train(args)
    finally:
        unregister("fake-for-test")
    assert "fake-for-test" not in method_names()
    with pytest.raises(UserError):
        get_method("fake-for-test")


def test_baseline_rows_go_through_certifys_run_directory(tmp_path):
    """baseline-certify's JSON rows in the shared run directory: whole rows resume, a cut last row is dropped and cut
    off the file, other settings are refused in one line with the recorded rows kept, and rows with no settings
    file are refused."""
    from certify.baseline_job import baseline_layout
    from certify.rowfile import RowWriter
    from certify.rundir import RunDirectory
    from transdenoiser.errors import UserError

    settings = {"seed": 1, "indices": [0, 5, 9]}
    run = RunDirectory(tmp_path / "run", settings, None, layout=baseline_layout())
    run.open()
    assert run.rows_path().name == "baseline_certify.rows.jsonl" and run.done_indices() == set()
    assert json.loads((tmp_path / "run" / "baseline_certify.settings.json").read_text()) == settings
    writer = RowWriter(run.rows_path(), run.layout.schema, run.header())
    writer.write({"idx": 0, "value": 1.5})
    writer.write({"idx": 5, "value": None})
    writer.close()
    with run.rows_path().open("a") as handle:
        handle.write('{"idx": 9, "val')  # the interrupted third row
    again = RunDirectory(tmp_path / "run", settings, None, layout=baseline_layout())
    again.open()
    assert again.done_indices() == {0, 5}
    assert again.rows() == [{"idx": 0, "value": 1.5}, {"idx": 5, "value": None}]
    assert run.rows_path().read_text() == '{"idx": 0, "value": 1.5}\n{"idx": 5, "value": null}\n'  # cut row gone
    with pytest.raises(UserError) as error:
        RunDirectory(tmp_path / "run", {**settings, "seed": 2}, None, layout=baseline_layout()).open()
    assert len(str(error.value).splitlines()) == 1 and "different settings (seed 1 there, 2 now)" in str(error.value)
    assert len(run.rows_path().read_text().splitlines()) == 2  # refused: the recorded rows are kept
    (tmp_path / "run" / "baseline_certify.settings.json").unlink()
    with pytest.raises(UserError, match="no baseline_certify.settings.json"):
        RunDirectory(tmp_path / "run", settings, None, layout=baseline_layout()).open()
    run.rows_path().write_text('{"idx": 0}\nnot json\n')
    (tmp_path / "run" / "baseline_certify.settings.json").write_text(json.dumps(settings))
    with pytest.raises(UserError, match=r"line 2: not a valid baseline-certify row"):
        again.done_indices()


# each denoiser arm's own config type (training/methods/denoiser_config.py): another arm's flag is refused in one
# line; a --config file shared by the arms is accepted, its other arms' keys noted and not used
OTHER_ARMS_FLAGS = {"nodp": (["--xi-up", "3"], "--xi-up"), "sepdp": (["--xi-low", "0.3"], "--xi-low"),
                    "transdenoiser": (["--noise-draws", "2"], "--noise-draws")}
SHARED_CONFIG = "sigma = 0.25\nclip_norm = 1.0\nxi_up = 2.0\nxi_low = 0.3\nmax_smin_dim = 100\nnoise_draws = 1\n"
NOTES = {"nodp": "arm nodp does not use clip_norm, xi_up (sepdp's and transdenoiser's settings), max_smin_dim, "
                 "xi_low (transdenoiser's settings), noise_draws (sepdp's setting)",
         "sepdp": "arm sepdp does not use max_smin_dim, xi_low (transdenoiser's settings)",
         "transdenoiser": "arm transdenoiser does not use noise_draws (sepdp's setting)"}


@pytest.mark.parametrize("arm", ["nodp", "sepdp", "transdenoiser"])
def test_a_denoiser_arm_refuses_another_arms_flag_in_one_line(arm, tmp_path, capsys):
    flag, spelled = OTHER_ARMS_FLAGS[arm]
    assert main(["train", "--arm", arm, *flag, "--classifier", str(tmp_path), "--out", str(tmp_path / "o"),
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith(f"--arm {arm} does not take {spelled}"), err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("arm", ["nodp", "sepdp", "transdenoiser"])
def test_a_shared_config_file_is_accepted_with_a_note_of_the_keys_the_arm_does_not_use(arm, tmp_path):
    from training.methods.denoiser_config import unused_note

    path = tmp_path / "shared.toml"
    path.write_text(SHARED_CONFIG)
    args = build_parser().parse_args(["train", "--config", str(path), "--arm", arm, "--epochs", "2"])
    from training.train_flags import method_and_settings

    method, settings, source = method_and_settings(args)
    config = method.config_from_settings(settings, source)
    assert isinstance(config, method.config_type) and config.epochs == 2 and config.sigma == 0.25
    assert unused_note(arm, method.unused_settings(settings, source)) == NOTES[arm]
    run = config.train_config()  # the run records the file's values, those the arm does not read included
    assert run.xi_low == 0.3 and run.max_smin_dim == 100 and run.noise_draws == 1
    assert run.xi_up == 2.0 and run.arm == arm
    # a key no arm has is still refused, naming the file
    path.write_text(SHARED_CONFIG + "robust_epsilon = 1.0\n")
    args = build_parser().parse_args(["train", "--config", str(path), "--arm", arm])
    method, settings, source = method_and_settings(args)
    with pytest.raises(UserError, match=rf"^--arm {arm} does not take robust_epsilon \(in --config "):
        method.config_from_settings(settings, source)


def test_a_resumed_run_keeps_its_saved_settings_and_still_refuses_another_arms_flag():
    from training.train_config import TrainConfig

    saved = asdict(TrainConfig(arm="sepdp", xi_low=0.3, max_smin_dim=100, epochs=3))
    method = get_method("sepdp")
    config = method.config_from_settings({"epochs": 4}, FLAGS, base=saved)
    assert asdict(config.train_config()) == {**saved, "epochs": 4}  # the saved TrainConfig, whole
    with pytest.raises(UserError, match=r"^--arm sepdp does not take --xi-low$"):
        method.config_from_settings({"xi_low": 0.3}, FLAGS, base=saved)


def test_the_api_refuses_a_setting_the_arm_does_not_use_in_one_line():
    from torch import nn

    from transdenoiser.api import train_private_denoiser

    for arm, settings, named in (("nodp", {"noise_multiplier": 2.0}, "noise_multiplier"),
                                 ("nodp", {"delta": 1e-6}, "delta"), ("sepdp", {"xi_low": 0.3}, "xi_low"),
                                 ("transdenoiser", {"noise_draws": 2}, "noise_draws")):
        with pytest.raises(UserError) as error:
            train_private_denoiser(nn.Linear(1, 1), None, test=None, arm=arm, **settings)
        assert str(error.value) == f"train_private_denoiser: arm {arm} does not take {named}"


def test_a_shared_config_run_records_the_full_train_config_and_notes_the_unused_keys(tmp_path, capsys,
                                                                                    random_classifier_dir):
    """metadata.json records the whole TrainConfig: the settings given, defaults for the rest. The file's
    transdenoiser keys are not used by sepdp but recorded as given, as before the arms had their own config
    types (the same metadata bytes)."""
    import torch

    from training.train_config import TrainConfig

    path = tmp_path / "shared.toml"
    path.write_text(SHARED_CONFIG)
    out = tmp_path / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = main(["train", "--config", str(path), "--arm", "sepdp", "--classifier", str(random_classifier_dir),
                     "--denoiser", "tiny", "--denoiser-width", "2", "--train-examples", "32", "--eval-examples",
                     "8", "--epochs", "1", "--batch-size", "16", "--clipping", "vmap", "--out", str(out),
                     "--device", "cpu"])
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert code == 0, err
    assert [line for line in err.splitlines() if line.startswith("note: --config")] == [
        f"note: --config {path}: {NOTES['sepdp']}"]
    recorded = json.loads((out / "metadata.json").read_text())["config"]
    expected = TrainConfig(arm="sepdp", sigma=0.25, clip_norm=1.0, xi_up=2.0, xi_low=0.3, max_smin_dim=100,
                           noise_draws=1, denoiser="tiny",
                           denoiser_kwargs={"width": 2}, train_examples=32, eval_examples=8, epochs=1,
                           batch_size=16, clipping="vmap")
    assert recorded == json.loads(json.dumps(asdict(expected)))
