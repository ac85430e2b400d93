"""What `transdenoiser demo` prints at the end works when pasted into a fresh shell: no bare `transdenoiser` that
needs an activated environment, files that exist, commands that parse."""
from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

from transdenoiser.cli import build_parser
from transdenoiser.demo import command_prefix, next_steps

ROOT = Path(__file__).resolve().parents[1]


def test_printed_commands_name_an_executable_and_parse(monkeypatch):
    monkeypatch.chdir(ROOT)
    lines = next_steps(Path("runs/demo/serve"))
    prefix = command_prefix()
    words = shlex.split(prefix)
    assert words[0] != "transdenoiser" and os.access(words[0], os.X_OK), prefix  # a path, runnable as printed
    commands = [shlex.split(line.strip()) for line in lines if line.strip().startswith(prefix)]
    assert commands and any("serve" in c for c in commands)
    for command in commands:
        argv = command[len(words):]
        args = build_parser(argv).parse_args(argv)  # SystemExit (status 2) on any flag the CLI does not take
        assert args.command == "serve" and args.model_dir == "runs/demo/serve"
    curls = [shlex.split(line.strip()) for line in lines if line.strip().startswith("curl ")]
    assert len(curls) == 2
    for curl in curls:
        upload = next(word for word in curl if word.startswith("images=@"))
        assert (ROOT / upload.removeprefix("images=@")).is_file()
        assert "http://127.0.0.1:3000/predict" in curl
    activate = re.search(r"source (\S+)", lines[-1])
    if activate:
        assert Path(activate.group(1)).is_file()


def test_the_prefix_falls_back_to_the_interpreter_when_no_script_is_installed(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))
    assert command_prefix() == f"{tmp_path / 'python3'} -m transdenoiser"
    assert "source" not in next_steps(Path("runs/demo/serve"))[-1]
