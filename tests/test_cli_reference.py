"""docs/CLI.md is what scripts/cli_reference.py generates from the parser (it cannot go stale), it covers every
command and visible flag, and building the parser for it imports no torch (the check takes well under a second)."""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def reference_script():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_cli_md_is_what_the_script_writes(capsys):
    code = reference_script().main(["--check"])
    assert code == 0, capsys.readouterr().err


def test_a_stale_page_fails_the_check_with_one_line(tmp_path, monkeypatch, capsys):
    script = reference_script()
    page = tmp_path / "CLI.md"
    monkeypatch.setattr(script, "PAGE", page)
    monkeypatch.setattr(script, "ROOT", tmp_path)
    assert script.main(["--check"]) == 1  # missing
    page.write_text(script.render().replace("| `--sigma` |", "| `--sigma-renamed` |", 1))
    assert script.main(["--check"]) == 1  # one flag differs
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "CLI.md is stale" in err and "--write" in err
    assert script.main(["--write"]) == 0 and script.main(["--check"]) == 0


def test_the_page_has_every_command_in_help_order_and_every_visible_flag():
    from transdenoiser.cli import COMMANDS, build_parser

    text = (ROOT / "docs" / "CLI.md").read_text()
    headings = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert headings == list(COMMANDS)
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in subparsers.choices.items():
        section = text.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        for action in parser._actions:
            if action.help is argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                assert all(f"`{flag}`" not in section for flag in action.option_strings), (name, action)
            else:
                assert all(f"`{flag}`" in section for flag in action.option_strings), (name, action)


def test_building_the_parser_imports_no_torch():
    code = ("import sys; from transdenoiser.cli import build_parser; build_parser(); "
            "sys.exit('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, f"building the parser imported torch: {result.stderr}"
