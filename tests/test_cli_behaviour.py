"""The command line never surprises: fast start, one-line flag errors, no abbreviations, no inert flags,
third-party warnings summarised once, and a command table that matches the modules."""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import subprocess
import sys
import time

import pytest

from transdenoiser import cli

HELP_BOUND_SECONDS = 3.0  # generous: about 0.1 s on an idle 2-core machine (RESULTS.md section 9)


def test_help_is_fast_and_imports_neither_torch_nor_numpy():
    code = ("import sys, time; started = time.perf_counter(); import transdenoiser.cli as c\n"
            "try:\n    c.main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "import json; print(json.dumps({'seconds': time.perf_counter() - started, "
            "'heavy': sorted(m for m in ('torch', 'numpy', 'scipy', 'dp_accounting', 'bentoml') "
            "if m in sys.modules)}))")
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - started
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["heavy"] == []
    assert wall < HELP_BOUND_SECONDS, f"transdenoiser --help took {wall:.2f} s (interpreter included)"
    assert "privacy-audit" in result.stdout and "import-classifier" in result.stdout


# Input errors of every command: none of their modules imports torch before the flags are checked.
BAD_INPUT = [
    ["data", "--bogus"], ["pretrain", "--epochs", "x"], ["pretrain", "--out"], ["import-classifier", "--arch"],
    ["certify", "--sigma", "abc"], ["predict", "--n", "-1"], ["report", "--device", "cpu"],
    ["attack", "--eps", "x"], ["audit", "--bogus"], ["privacy", "--bogus"], ["serve", "--seed", "1"],
    ["demo", "--n", "0"], ["train-head", "--bogus"], ["certfy"], ["train", "--bogus"], ["train", "--sig", "1"],
]


def test_input_errors_are_one_line_fast_and_import_no_torch():
    code = ("import sys, json, io, contextlib, time\nimport transdenoiser.cli as c\nout = []\n"
            f"for argv in {BAD_INPUT!r}:\n"
            "    err = io.StringIO(); started = time.perf_counter()\n"
            "    with contextlib.redirect_stderr(err):\n"
            "        try:\n            code = c.main(argv)\n"
            "        except SystemExit as e:\n            code = e.code\n"
            "    out.append([argv, code, err.getvalue(), time.perf_counter() - started])\n"
            "print(json.dumps({'runs': out, 'torch': 'torch' in sys.modules}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["torch"] is False
    for argv, code, err, seconds in report["runs"]:
        lines = err.strip().splitlines()
        assert code == 2, (argv, err)
        assert len(lines) == 1 and "usage:" not in err, (argv, err)
        assert "error:" in lines[0] and "--help'" in lines[0], (argv, err)
        assert seconds < HELP_BOUND_SECONDS, (argv, seconds)


def test_flag_error_names_the_command_and_its_help(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["data", "--bogus"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == ("transdenoiser data: error: unrecognized arguments: --bogus "
                                       "(see 'transdenoiser data --help')\n")


def test_abbreviated_flags_are_refused(capsys):
    with pytest.raises(SystemExit):
        cli.main(["pretrain", "--epoch", "3", "--out", "unused"])
    assert "unrecognized arguments: --epoch 3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["data", "--data", "x"])  # would have been --data-root
    assert "--data" in capsys.readouterr().err


@pytest.mark.parametrize(("command", "flag"), [("data", "--device"), ("data", "--seed"), ("report", "--seed"),
                                               ("report", "--device"), ("certify-merge", "--device"),
                                               ("privacy", "--seed"), ("serve", "--seed"),
                                               ("import-classifier", "--seed")])
def test_commands_do_not_offer_flags_they_ignore(command, flag):
    parser = cli.build_parser([command])
    sub = parser._subparsers._group_actions[0].choices[command]  # noqa: SLF001 - the parser under test
    assert flag not in sub._option_string_actions  # noqa: SLF001
    with pytest.raises(SystemExit):
        parser.parse_args([command, flag, "1"])


def test_commands_that_use_device_and_seed_keep_them():
    for command in ("pretrain", "certify", "attack", "serve"):
        parser = cli.build_parser([command])
        sub = parser._subparsers._group_actions[0].choices[command]  # noqa: SLF001
        assert "--device" in sub._option_string_actions, command  # noqa: SLF001
    args = cli.build_parser(["data"]).parse_args(["data"])
    assert args.device == "auto" and args.seed == 0  # handlers that ask still see the defaults


def test_command_table_matches_what_the_modules_register():
    found = {}
    for module in cli.SUBCOMMAND_MODULES:
        parser = argparse.ArgumentParser()
        subparsers = parser.add_subparsers()
        importlib.import_module(module).register(subparsers, cli.common_parser())
        for action in subparsers._choices_actions:  # noqa: SLF001
            found[action.dest] = (module, action.help)
    assert found == cli.COMMANDS


# A stand-in command that logs as dp-accounting does at a large sample rate (absl, one line per RDP order).
def register(subparsers, common):
    p = subparsers.add_parser("absl-noise", parents=[common], help="test only")
    p.set_defaults(handler=lambda args: [logging.getLogger("absl").warning(
        "_compute_log_a_frac failed to converge after 1000 iterations with q=0.5, alpha=%s", 1 + i / 10)
        for i in range(21)] and 0)


def test_third_party_convergence_warnings_are_summarised_once(monkeypatch, capsys, caplog):
    monkeypatch.setitem(cli.COMMANDS, "absl-noise", ("tests.test_cli_behaviour", "test only"))
    with caplog.at_level(logging.WARNING, logger="absl"):  # as dp-accounting leaves it (other tests may raise it)
        assert cli.main(["absl-noise"]) == 0
    assert not [r for r in caplog.records if "failed to converge" in r.getMessage()]
    notes = [line for line in capsys.readouterr().err.splitlines() if "did not converge" in line]
    assert notes == [cli.CONVERGENCE_NOTE.format(count=21)]
    assert not logging.getLogger("absl").filters  # the filter belongs to the CLI run only


def test_startup_benchmark_quick(tmp_path):
    from benchmarks import bench_startup

    out = tmp_path / "startup.json"
    assert bench_startup.main(["--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["median_seconds"]) == {"help", "flag_error", "train_flag_error"}
    assert all(0 < seconds < 60 for seconds in result["median_seconds"].values())


def test_torch_free_training_choices_match_the_modules():
    from training import choices, denoisers, train_config
    from training.baselines import securesgd, stobatch
    from training.methods import method_names, recipe

    assert choices.ARMS == (*train_config.ARMS, recipe.NAME, *securesgd.ARMS, stobatch.ARM) == method_names()
    assert choices.OPTIMIZERS == train_config.OPTIMIZERS
    assert choices.DENOISERS == denoisers.DENOISERS and choices.ACTIVATIONS == tuple(denoisers.ACTIVATIONS)


def test_uv_is_installed_so_bentoml_build_installs_nothing():
    """`bentoml build` pip-installs uv when it finds neither the package nor an executable (still true of this
    BentoML?): uv is a dependency of the project, installed, and docs/SERVING.md says so."""
    import importlib.metadata
    import inspect
    from pathlib import Path

    pytest.importorskip("bentoml")
    from _bentoml_sdk.images import Image
    from bentoml._internal import configuration

    assert "get_uv_command()" in inspect.getsource(Image._freeze_python_requirements)
    source = inspect.getsource(configuration.get_uv_command.__wrapped__)
    assert 'shutil.which("uv")' in source and '"pip", "install", "-q", "uv"' in source
    doc = (Path(__file__).resolve().parents[1] / "docs" / "SERVING.md").read_text()
    assert 'importlib.metadata.version("uv")' in source
    assert importlib.metadata.version("uv")  # raises PackageNotFoundError if the set-up did not install it
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert '"uv>=' in pyproject and "**`uv` is one of the project's dependencies**" in doc


def test_deprecated_spelling_still_works_with_a_note(capsys):
    from transdenoiser.argtypes import add_deprecated_spelling, positive_int

    parser = cli.CommandLineParser(prog="transdenoiser x")
    parser.add_argument("--batch-size", type=positive_int, default=None)
    add_deprecated_spelling(parser, "--batch", "--batch-size", "batch_size", type=positive_int)
    assert parser.parse_args(["--batch", "8"]).batch_size == 8
    assert capsys.readouterr().err == ("note: --batch is now spelled --batch-size (the old spelling still works "
                                       "for now)\n")
    assert parser.parse_args([]).batch_size is None and "--batch " not in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--batch", "0"])


def test_demo_passes_each_step_only_the_common_options_it_takes(monkeypatch, tmp_path):
    from transdenoiser import demo

    calls = []
    monkeypatch.setattr(cli, "main", lambda argv: calls.append(argv) or 0)
    monkeypatch.setattr(demo, "_done", lambda directory: False)
    monkeypatch.setattr("serving.bundle.write_model_dir", lambda *a, **k: None)
    args = cli.build_parser(["demo"]).parse_args(["demo", "--out", str(tmp_path), "--device", "cpu", "--seed", "3"])
    assert demo.cmd_demo(args) == 0
    by_command = {argv[0]: argv for argv in calls}
    assert "--device" not in by_command["data"] and "--seed" not in by_command["data"]
    for command in ("pretrain", "train", "certify"):
        assert by_command[command][-4:] == ["--device", "cpu", "--seed", "3"], command
    for argv in calls:  # and every step's flags parse
        cli.build_parser(argv).parse_args(argv)


def test_demo_trains_the_recipe_with_the_objective_that_measured_best():
    """Issue 66: `make demo` trains the objective that certified most at equal epsilon (RESULTS.md section 12),
    with the recipe's data-independent guarantee; the transdenoiser arm's analysis covers MSE only."""
    from training.methods.denoiser_config import RECIPE_OBJECTIVE
    from training.train_config import load_config_file
    from transdenoiser import demo

    config = load_config_file(demo.DEMO_CONFIG)
    assert (config.arm, config.objective, config.sigma, config.target_epsilon) == (
        "recipe", RECIPE_OBJECTIVE, demo.SIGMA, 1.0)
    assert RECIPE_OBJECTIVE == "stability+mse"


def test_output_into_a_closed_pipe_ends_quietly_with_status_0():
    """`transdenoiser privacy ... | head -1`: the reader goes away, the write fails with EPIPE (BrokenPipeError, an
    OSError that is not a file-system refusal); the command ends with status 0 and no traceback."""
    code = ("import os, sys\nfrom transdenoiser import cli\nread_end, write_end = os.pipe()\nos.close(read_end)\n"
            "os.dup2(write_end, 1)\nsys.stdout = os.fdopen(1, 'w', buffering=1)\n"
            "status = cli.main(['privacy', '--sample-rate', '0.02', '--noise-multiplier', '1', '--steps', '10',"
            " '--delta', '1e-5'])\n"
            "sys.stderr.write(f'status {status}')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stderr == "status 0", result.stderr[-2000:]
