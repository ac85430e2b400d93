"""Mutation check: hand-made mutations of the functions that carry a promise, each run against its tests.

Every mutant (the list is scripts/mutants.py) names a file, a function in it, an exact source snippet (found
exactly once inside that function) and its replacement. The tracked (and new, not ignored) files of the checkout
are copied to a temporary directory once; each mutant is applied there, the tests named for it run there
(``python -m pytest -x`` with the copy as working directory and PYTHONPATH, bytecode writing off), and the file
is restored. The shared checkout is never written. A mutant is

- killed: a test failed (or the run timed out);
- survived: every test passed. Each survivor must be killed by a new test or explained as equivalent in
  docs/DESIGN.md (section "Mutation check");
- not applicable: its snippet is missing or not unique in the function (the source changed: update the list);
- error: the tests could not run (e.g. none collected). Not applicable and error are reported loudly and make
  the exit status non-zero, as survivors do.

Usage: ``python scripts/mutate.py`` (all), ``--quick`` (three fast mutants), ``--only NAME [NAME ...]``,
``--list``, ``--check`` (snippets only, no tests). ``make mutate`` runs it with the project's interpreter.
"""
from __future__ import annotations

import argparse
import ast
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the list: scripts/mutants.py

from mutants import MUTANTS, Mutant  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PYTEST = ("-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--timeout=600")
QUICK = ("cp_two_sided_alpha", "pgd_iterates_unprojected", "api_key_not_compared")
IMPORT_CHECK = ("certify.core", "certify.attacks", "serving.auth", "serving.validation", "training.privacy.dp",
                "training.privacy.ghost_clipping", "training.privacy.clipping", "training.private_train",
                "training.arms", "training.train_config", "training.train_state", "training.privacy.report",
                "training.checkpoint", "training.privacy.smin")


# ---------------------------------------------------------------------------------------------- applying

def function_span(source: str, qualified: str) -> tuple[int, int] | None:
    """Character offsets of the (first) function ``qualified`` ("name" or "Class.name") in ``source``."""
    tree = ast.parse(source)
    parts = qualified.split(".")

    def find(body, names):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == names[0]:
                if len(names) == 1:
                    return node
                found = find(node.body, names[1:])
                if found is not None:
                    return found
        return None

    node = find(tree.body, parts)
    if node is None:
        return None
    lines = source.splitlines(keepends=True)
    start = sum(len(line) for line in lines[:node.lineno - 1])
    end = sum(len(line) for line in lines[:node.end_lineno])
    return start, end


def apply(source: str, mutant: Mutant) -> tuple[str | None, str]:
    """(mutated source, "") or (None, why the mutant does not apply)."""
    span = function_span(source, mutant.function)
    if span is None:
        return None, f"function {mutant.function} not found in {mutant.path}"
    start, end = span
    count = source[start:end].count(mutant.original)
    if count != 1:
        return None, f"snippet found {count} times in {mutant.path}:{mutant.function} (needs exactly 1)"
    body = source[start:end].replace(mutant.original, mutant.replacement)
    return source[:start] + body + source[end:], ""


def check_snippets(root: Path = ROOT, mutants: tuple[Mutant, ...] = MUTANTS) -> list[str]:
    """Problems with the list: mutants that do not apply to the source at ``root``, or that change nothing."""
    problems = []
    names = [m.name for m in mutants]
    problems += [f"duplicate mutant name {n}" for n in sorted(set(n for n in names if names.count(n) > 1))]
    for mutant in mutants:
        path = root / mutant.path
        if not path.is_file():
            problems.append(f"{mutant.name}: {mutant.path} does not exist")
            continue
        mutated, why = apply(path.read_text(), mutant)
        if mutated is None:
            problems.append(f"{mutant.name}: {why}")
        elif mutant.original == mutant.replacement:
            problems.append(f"{mutant.name}: replacement equals the original")
        else:
            ast.parse(mutated)  # a mutant must still be valid Python
        for arg in mutant.tests:
            if arg.startswith("tests/") and not (root / arg.split("::")[0]).is_file():
                problems.append(f"{mutant.name}: test file {arg} does not exist")
    return problems


# ---------------------------------------------------------------------------------------------- running

def copy_checkout(destination: Path) -> None:
    """Copy the tracked files and the new, not ignored ones (their working-tree contents) to ``destination``."""
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listing):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def environment(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(copy)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a mutant of the same size and mtime must never reuse stale bytecode
    return env


def verify_imports(copy: Path) -> None:
    """The copy's modules, not the editable install's, must be the ones imported."""
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    print(importlib.import_module(name).__file__)"
    result = subprocess.run([sys.executable, "-c", code, *IMPORT_CHECK], cwd=copy, env=environment(copy),
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"mutate: importing from the copy failed:\n{result.stderr}")
    outside = [p for p in result.stdout.split() if not Path(p).resolve().is_relative_to(copy.resolve())]
    if outside:
        raise SystemExit(f"mutate: modules imported from outside the copy {copy}: {outside}")


def run_tests(copy: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, float, str]:
    started = time.perf_counter()
    try:
        result = subprocess.run([sys.executable, *PYTEST, *tests], cwd=copy, env=environment(copy),
                                capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "killed (timeout)", time.perf_counter() - started, ""
    seconds = time.perf_counter() - started
    tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-3:])
    if result.returncode == 0:
        return "survived", seconds, tail
    if result.returncode == 1:
        failed = [line for line in result.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
        return "killed", seconds, failed[0] if failed else tail
    return f"error (pytest exit {result.returncode})", seconds, tail


def baseline_suites(mutants: list[Mutant]) -> list[tuple[str, ...]]:
    """Few test runs covering every mutant's tests: one over all the plainly named files and tests (a superset
    of each plain suite and of the -k suites on those files), plus each -k suite on a file not in it."""
    plain: list[str] = []
    for m in mutants:
        if "-k" not in m.tests:
            plain += [arg for arg in m.tests if arg not in plain]
    files = {arg.split("::")[0] for arg in plain if "::" not in arg}
    narrowed = sorted({m.tests for m in mutants
                       if "-k" in m.tests and not {a for a in m.tests if a.startswith("tests/")} <= files})
    return ([tuple(plain)] if plain else []) + narrowed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these mutants")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--check", action="store_true", help="check that every snippet applies; run no tests")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per test run (default 900)")
    parser.add_argument("--no-baseline", action="store_true", help="skip running the tests on the unmutated copy")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # killed: stop the running tests too and remove the copy
    chosen = list(MUTANTS)
    if args.quick:
        chosen = [m for m in MUTANTS if m.name in QUICK]
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in MUTANTS})
        if unknown:
            parser.error(f"unknown mutant(s): {', '.join(unknown)}")
        chosen = [m for m in MUTANTS if m.name in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.name:28s} {m.path}:{m.function}  [{m.promise}]")
        return 0
    problems = check_snippets(ROOT, tuple(chosen))
    if args.check:
        print("\n".join(problems) if problems else f"all {len(chosen)} mutants apply")
        return 1 if problems else 0

    started = time.perf_counter()
    results: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="mutate-") as tmp:
        copy = Path(tmp) / "repo"
        copy_checkout(copy)
        verify_imports(copy)
        print(f"mutate: {len(chosen)} mutants in a copy at {copy}; commit {git_commit()}", flush=True)
        if not args.no_baseline:
            for tests in baseline_suites(chosen):
                status, seconds, tail = run_tests(copy, tests, args.timeout)
                if status != "survived":  # the unmutated code must pass, else "killed" means nothing
                    print(f"mutate: BASELINE FAILS for {' '.join(tests)} ({status}, {seconds:.0f} s)\n{tail}")
                    return 2
                print(f"baseline ok {seconds:6.1f} s  {' '.join(tests)}", flush=True)
        for mutant in chosen:
            path = copy / mutant.path
            original = path.read_text()
            mutated, why = apply(original, mutant)
            if mutated is None:
                results[mutant.name] = "not applicable"
                print(f"NOT APPLICABLE  {mutant.name}: {why}", flush=True)
                continue
            path.write_text(mutated)
            try:
                status, seconds, detail = run_tests(copy, mutant.tests, args.timeout)
            finally:
                path.write_text(original)
            results[mutant.name] = status
            print(f"{status:16s} {seconds:6.1f} s  {mutant.name}  ({mutant.path}:{mutant.function})"
                  + (f"\n                 by {detail}" if status == "killed" and detail else "")
                  + (f"\n{detail}" if status.startswith("error") else ""), flush=True)
    elapsed = time.perf_counter() - started
    killed = sum(s.startswith("killed") for s in results.values())
    equivalent = {m.name for m in MUTANTS if m.equivalent}
    explained = [n for n, s in results.items() if s == "survived" and n in equivalent]
    survivors = [n for n, s in results.items() if s == "survived" and n not in equivalent]
    other = [n for n, s in results.items() if not s.startswith("killed") and s != "survived"]
    print(f"\nmutate: {killed} killed, {len(survivors) + len(explained)} survived ({len(explained)} of them "
          f"equivalent, explained in docs/DESIGN.md), {len(other)} not applicable or error, of {len(results)} "
          f"mutants in {elapsed:.0f} s")
    for name in explained:
        m = next(m for m in MUTANTS if m.name == name)
        print(f"EQUIVALENT {name}: {m.equivalent}")
    for name in survivors:
        m = next(m for m in MUTANTS if m.name == name)
        print(f"SURVIVED (unexplained) {name}: {m.path}:{m.function}: {m.original!r} -> {m.replacement!r} "
              f"[{m.promise}]")
    for name in other:
        print(f"NOT RUN   {name}: {results[name]}")
    return 0 if not survivors and not other else 1


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def git_commit() -> str:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return result.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


if __name__ == "__main__":
    sys.exit(main())
