"""The docs' code stays true: every `transdenoiser` command line in the README and docs/ parses with the real
command-line parser and uses no deprecated spelling, every Python snippet's imports and keywords exist, and the
example output docs/ACCOUNTING.md calls verbatim is what the commands print (below). A renamed or removed flag,
module or argument, or a changed figure, fails here, not in a reader's terminal.

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


def code_blocks(text: str, languages: tuple[str, ...] | None = None) -> list[str]:
    """The fenced code blocks of a markdown text whose info string is one of ``languages`` (None: any)."""
    blocks, current, language = [], None, ""
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current, language = [], line[3:].strip()
            else:
                if languages is None or language in languages:
                    blocks.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def command_lines(text: str) -> list[str]:
    lines = []
    for block in code_blocks(text):
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


# `train` lines: every setting given is one the arm takes (training/methods: each arm's config type); a config file
# that is not in the repository (one the reader writes first) and --resume (the saved run's arm) are left out
TRAIN_LINES = [(doc, words) for doc, words in CHECKED
               if words[:1] == ["train"] and not {"--help", "-h", "--resume"} & set(words)]


def test_documented_train_lines_are_checked():
    assert len(TRAIN_LINES) >= 10, len(TRAIN_LINES)


@pytest.mark.parametrize("doc, words", TRAIN_LINES, ids=[f"{doc}:{' '.join(w)[:60]}" for doc, w in TRAIN_LINES])
def test_documented_train_line_gives_the_arm_only_its_own_settings(doc, words, monkeypatch):
    from training.train_flags import method_and_settings

    monkeypatch.chdir(REPO)
    args = build_parser(words).parse_args(words)
    if args.config is not None and not Path(args.config).exists():
        return  # a config file the reader writes first (e.g. --write-config's output): its keys are not known here
    method, settings, source = method_and_settings(args)
    method.config_from_settings(settings, source)  # raises on a setting the arm does not take


# ---------------------------------------------------------------------------------------------- Python snippets
# docs/API.md's blocks run in tests/test_api.py. The other docs' snippets use names a reader supplies (images,
# a classifier), so they are checked statically: every import resolves, and every keyword a call passes to one of
# our functions, classes or methods (on a variable made by one of our classes) is in its signature.
SNIPPET_DOCS = [path for path in DOCS if path.name != "API.md"]


def python_snippets() -> list[tuple[str, str]]:
    return [(path.relative_to(REPO).as_posix(), block) for path in SNIPPET_DOCS
            for block in code_blocks(path.read_text(), ("python",))]


def check_snippet(source: str) -> list[str]:
    import ast
    import importlib
    import inspect

    problems, names, kinds = [], {}, {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    problems.append(f"{node.module} has no {alias.name}")
                else:
                    names[alias.asname or alias.name] = getattr(module, alias.name)
    for node in ast.walk(tree):  # variables made by one of our classes: x = Class(...)
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and inspect.isclass(names.get(node.value.func.id))):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    kinds[target.id] = names[node.value.func.id]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in names:
            target, label = names[func.id], func.id
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in kinds:
            target, label = getattr(kinds[func.value.id], func.attr, None), f"{func.value.id}.{func.attr}"
            if target is None:
                problems.append(f"{kinds[func.value.id].__name__} has no {func.attr}")
                continue
        else:
            continue
        parameters = inspect.signature(target).parameters
        if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            continue
        problems += [f"{label}() takes no keyword {kw.arg!r}" for kw in node.keywords
                     if kw.arg is not None and kw.arg not in parameters]
    return problems


SNIPPETS = python_snippets()


def test_the_docs_have_python_snippets_to_check():
    assert len(SNIPPETS) >= 4


@pytest.mark.parametrize("doc, source", SNIPPETS, ids=[f"{doc}#{i}" for i, (doc, _) in enumerate(SNIPPETS)])
def test_python_snippet_imports_and_keywords_exist(doc, source):
    assert check_snippet(source) == [], doc


def test_the_snippet_check_catches_a_renamed_keyword_and_a_missing_name():
    assert check_snippet("from certify.core import Smooth\nsmooth = Smooth(c, num_classes=10, sigma=0.25)\n"
                         "smooth.certify(x, n0=1, n=2, alfa=0.1)") == ["smooth.certify() takes no keyword 'alfa'"]
    assert check_snippet("from certify.core import Smoothed") == ["certify.core has no Smoothed"]


# ------------------------------------------------------------------------------------- verbatim example output
def verbatim_examples(path: Path) -> list[tuple[list[str], str]]:
    """(argv, expected output) for each ``$ transdenoiser ...`` line of ``path``'s plain code blocks."""
    examples = []
    for block in code_blocks(path.read_text(), ("",)):
        for part in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, _, output = part.partition("\n")
            examples.append((shlex.split(command)[1:], output.rstrip("\n")))
    return examples


ACCOUNTING_EXAMPLES = verbatim_examples(REPO / "docs" / "ACCOUNTING.md")


def test_accounting_has_verbatim_examples():
    assert len(ACCOUNTING_EXAMPLES) >= 6


@pytest.mark.parametrize("argv, expected", ACCOUNTING_EXAMPLES, ids=[" ".join(a) for a, _ in ACCOUNTING_EXAMPLES])
def test_accounting_examples_print_what_the_doc_shows(argv, expected, capsys):
    """docs/ACCOUNTING.md says its examples are real output, reproduced verbatim: rerun each and compare."""
    from transdenoiser.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    printed = (captured.out + captured.err).rstrip("\n")
    assert printed == expected
    assert code == (2 if "error:" in expected else 0)
