"""Every `transdenoiser` command line in the README and docs/ parses with the real command-line parser, and uses no
deprecated spelling: a renamed or removed flag fails here, not in a reader's terminal.

Command lines come from fenced code blocks (continuation lines joined; comments, pipes and redirections cut). Lines
with placeholders (``$VAR``, ``[--optional]``, ``...``, ``<tag>``, upper-case names such as ``ARM`` or ``I/K``)
cannot be parsed as written and are left out; the test checks that most lines are checked, so it cannot pass by
skipping them all. Parsing runs no command (nothing is trained, read or written).
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from transdenoiser.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SHELL_STOPS = {"|", "||", "&&", ";", "&", "2>&1"}
PLACEHOLDER = re.compile(r"\$|\[|\.\.\.|<|(^|/)[A-Z][A-Z_]*(/|$)")


def command_lines(text: str) -> list[str]:
    lines = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            match = re.search(r"(?:^|\s|/)transdenoiser\s+([a-z][a-z-]*(?:\s.*)?)$", line.strip())
            if match and not line.strip().startswith("#"):
                lines.append(match.group(1))
    return lines


def words_of(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    for i, word in enumerate(words):
        if word in SHELL_STOPS or word.startswith((">", "2>")):
            return words[:i]
    return words


DOC_COMMANDS = [(path.relative_to(REPO).as_posix(), words_of(line)) for path in DOCS
                for line in command_lines(path.read_text())]
CHECKED = [(doc, words) for doc, words in DOC_COMMANDS if not any(PLACEHOLDER.search(word) for word in words)]


def test_most_documented_commands_are_checked():
    assert len(DOC_COMMANDS) >= 50 and len(CHECKED) >= 0.6 * len(DOC_COMMANDS), (len(CHECKED), len(DOC_COMMANDS))


@pytest.mark.parametrize("doc, words", CHECKED, ids=[f"{doc}:{' '.join(words)[:60]}" for doc, words in CHECKED])
def test_documented_command_parses(doc, words, capsys):
    try:
        build_parser(words).parse_args(words)
    except SystemExit as exc:
        assert exc.code == 0, f"{doc}: `transdenoiser {shlex.join(words)}`: {capsys.readouterr().err.strip()}"
    notes = capsys.readouterr().err
    assert "note:" not in notes, f"{doc}: `transdenoiser {shlex.join(words)}` uses a deprecated spelling: {notes}"
