"""The mutation check's list (scripts/mutate.py) cannot rot: every mutant still applies to the current source."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_mutate():
    spec = importlib.util.spec_from_file_location("mutate_script", ROOT / "scripts" / "mutate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_mutant_applies_exactly_once_in_its_function():
    mutate = load_mutate()
    assert mutate.check_snippets(ROOT) == []
    assert len(mutate.MUTANTS) >= 25 and set(mutate.QUICK) <= {m.name for m in mutate.MUTANTS}


def test_a_missing_snippet_is_reported_not_applicable():
    mutate = load_mutate()
    ghost = mutate.Mutant("ghost", "transdenoiser/stats.py", "clopper_pearson_lower", "no such text", "x",
                          ("tests/test_invariants_certify.py",), "none")
    wrong_function = mutate.Mutant("elsewhere", "certify/decisions.py", "radius_from_p_lower",
                                   "trials - successes + 1, alpha)", "alpha", (), "none")
    problems = mutate.check_snippets(ROOT, (ghost, wrong_function))
    assert len(problems) == 2 and "found 0 times" in problems[0] and "found 0 times" in problems[1]
    source = (ROOT / "transdenoiser/stats.py").read_text()
    assert mutate.apply(source, ghost)[0] is None
    mutated, _ = mutate.apply(source, mutate.MUTANTS[0])
    assert mutated != source and mutated.count("trials - successes + 1, 2 * alpha)") == 1
