"""The ledger of certification tests (certify.ledger): runs on one seed that read one test are accepted in any --out;
another test of the same images and seed (another fixed n, method or mode) is refused before any forward pass unless
--new-test, and the run's summary says how many tests of those images and seed the ledger holds."""
from __future__ import annotations

import json
import threading

import pytest

from certify import ledger
from tests.conftest import run_cli
from transdenoiser.errors import UserError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def certify(classifier, out, *extra, images=("--max-index", "4")):
    """A tiny certify run: n0 8, batch 32, on CPU, images 0-3 unless ``images`` says otherwise."""
    return ["certify", "--classifier", classifier, "--sigma", "0.25", "--n0", "8", "--batch-size", "32",
            *images, "--out", out, "--device", "cpu", *extra]


def summary_test(out) -> dict:
    return json.loads((out / "summary.json").read_text())["test"]


def statistic(test: str) -> str:
    """The statistic part of a test identity ("clopper-pearson n=16 | n0=8 sigma=..." -> "clopper-pearson n=16")."""
    return test.split(" | ")[0]


SAMPLING = "n0=8 alpha=0.001"


def ledger_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_another_fixed_n_on_one_seed_is_refused_then_run_with_new_test(random_classifier_dir, tmp_path, capsys,
                                                                       certification_ledger):
    first, second = tmp_path / "a", tmp_path / "b"
    assert run_cli(certify(random_classifier_dir, first, "--n", "16"), capsys)[0] == 0
    assert summary_test(first)["test"] == f"clopper-pearson n=16 | {SAMPLING}"
    assert summary_test(first)["tests_of_these_images"] == 1
    code, _, err = run_cli(certify(random_classifier_dir, second, "--n", "32"), capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"{first} certified images 0-3 on seed 0 with clopper-pearson n=16 | {SAMPLING}" in err
    assert f"(clopper-pearson n=32 | {SAMPLING}) spends alpha again: pass --new-test" in err
    assert str(certification_ledger) in err
    assert not second.exists()  # refused before the run directory was made
    assert len(ledger_lines(certification_ledger)) == 1
    assert run_cli(certify(random_classifier_dir, second, "--n", "32", "--new-test"), capsys)[0] == 0
    assert summary_test(second) | {"note": None} == {
        "format_version": 1, "test": f"clopper-pearson n=32 | {SAMPLING}",
        "stream_key": summary_test(first)["stream_key"],
        "tests_of_these_images": 2, "ledger": str(certification_ledger), "note": None}
    assert [statistic(line["test"]) for line in ledger_lines(certification_ledger)] == ["clopper-pearson n=16",
                                                                                        "clopper-pearson n=32"]
    assert run_cli(certify(random_classifier_dir, first, "--n", "16"), capsys)[0] == 0  # its own test, resumed
    assert len(ledger_lines(certification_ledger)) == 2
    # overlapping images only: a later run on images 2-5 meets both tests there
    code, _, err = run_cli(certify(random_classifier_dir, tmp_path / "c", "--n", "16", "--radius", "0.25",
                                   images=("--indices", "2-5")), capsys)
    assert code == 2 and "certified images 2-3 on seed 0 with clopper-pearson n=16" in err
    assert "(and 1 other run)" in err and f"(ladder | {SAMPLING})" in err


def test_adaptive_runs_at_other_radii_and_modes_are_one_test(random_classifier_dir, tmp_path, capsys,
                                                             certification_ledger):
    decide, estimate = tmp_path / "decide", tmp_path / "estimate"
    assert run_cli(certify(random_classifier_dir, decide, "--radius", "0.25", "--n-max", "64"), capsys)[0] == 0
    assert run_cli(certify(random_classifier_dir, estimate, "--adaptive", "--n-max", "128", "--tolerance", "0.1"),
                   capsys)[0] == 0
    assert summary_test(decide)["test"] == summary_test(estimate)["test"] == f"ladder | {SAMPLING}"
    assert summary_test(estimate)["tests_of_these_images"] == 1
    assert summary_test(decide)["stream_key"] == summary_test(estimate)["stream_key"]
    # a fixed-n run beside them is another test
    code, _, err = run_cli(certify(random_classifier_dir, tmp_path / "fixed", "--n", "16"), capsys)
    assert code == 2 and f"with ladder | {SAMPLING}; another test of the same images and seed (clopper-pearson" in err
    # another alpha (or n0) on the same seed and images is another test of the same question on the same draws
    code, _, err = run_cli(certify(random_classifier_dir, tmp_path / "alpha", "--radius", "0.25", "--n-max", "64",
                                   "--alpha", "0.01"), capsys)
    assert code == 2 and "alpha=0.01" in err and "pass --new-test" in err


def test_the_same_test_again_and_another_seed_are_accepted(random_classifier_dir, tmp_path, capsys,
                                                           certification_ledger):
    runs = [(tmp_path / "a", []), (tmp_path / "again", []), (tmp_path / "seed1", ["--seed", "1", "--n", "32"])]
    for out, extra in runs:
        assert run_cli(certify(random_classifier_dir, out, "--n", "16", *extra), capsys)[0] == 0
        assert summary_test(out)["tests_of_these_images"] == 1
    assert summary_test(tmp_path / "seed1")["stream_key"] != summary_test(tmp_path / "a")["stream_key"]
    assert run_cli(certify(random_classifier_dir, tmp_path / "a", "--n", "16"), capsys)[0] == 0  # a finished resume
    assert [line["run_dir"] for line in ledger_lines(certification_ledger)] == [str(out) for out, _ in runs]


def test_a_corrupt_ledger_line_is_one_error_naming_the_file_and_line(random_classifier_dir, tmp_path, capsys,
                                                                    certification_ledger):
    assert run_cli(certify(random_classifier_dir, tmp_path / "a", "--n", "16"), capsys)[0] == 0
    with certification_ledger.open("a") as handle:
        handle.write('{"stream_key": "cut sho\n')
    before = certification_ledger.read_text()
    code, _, err = run_cli(certify(random_classifier_dir, tmp_path / "b", "--n", "16", "--seed", "3"), capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"{certification_ledger} line 2: not a JSON line" in err and "fix or delete the line" in err
    assert certification_ledger.read_text() == before and not (tmp_path / "b").exists()


def entry(test: str, images: range, seed: int = 0, run_dir: str = "/runs/x") -> ledger.LedgerEntry:
    return ledger.new_entry({"seed": seed, "n0": 100}, images, test, run_dir)


def test_ranges_overlap_and_identities():
    assert ledger.compact_ranges([5, 0, 1, 2, 9, 3, 7, 8]) == "0-3,5,7-9"
    assert ledger.parse_ranges("0-3,5,7-9") == [(0, 3), (5, 5), (7, 9)]
    assert ledger.overlap([(0, 3), (5, 5), (7, 9)], [(3, 7)]) == [(3, 3), (5, 5), (7, 7)]
    assert ledger.overlap([(0, 3)], [(4, 9)]) == []
    assert ledger.describe_ranges([(i, i) for i in range(0, 40, 2)]).endswith(",10,... (20 images)")
    assert ledger.identify_test(None, 1000) == "clopper-pearson n=1000"
    assert ledger.identify_test("decide", 10, 0.5) == ledger.identify_test("estimate", 99) == "ladder"
    assert ledger.identify_test("decide", 10, 0.5, "union-cp") == "union-cp decide radius=0.5 n_max=10"
    assert ledger.identify_test("decide", 10, 0.5, "beta-mixture") == "beta-mixture decide radius=0.5"
    assert ledger.identify_test("estimate", 10, None, "union-cp") == "union-cp estimate n_max=10"
    verdict = ledger.judge([entry("clopper-pearson n=10", range(0, 5)), entry("ladder", range(5, 10)),
                            entry("clopper-pearson n=20", range(0, 5), seed=1)], entry("ladder", range(4, 6)))
    assert [e.test for e in verdict.conflicts] == ["clopper-pearson n=10"] and verdict.tests == 2


def test_two_runs_recording_at_once_never_both_pass(tmp_path, monkeypatch):
    """Eight threads record eight different tests of one image at once: the lock lets exactly one through (the
    reading is slowed down so that, without the lock, several would read the ledger before any wrote)."""
    path = tmp_path / "ledger.jsonl"
    slow_parse = ledger._parse

    def parse_slowly(text, where):
        threading.Event().wait(0.05)
        return slow_parse(text, where)

    monkeypatch.setattr(ledger, "_parse", parse_slowly)
    results: list[str] = []

    def run(n: int) -> None:
        try:
            ledger.record(entry(f"clopper-pearson n={n}", range(1), run_dir=f"/runs/{n}"), new_test=False, path=path)
            results.append("recorded")
        except UserError:
            results.append("refused")

    threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == ["recorded"] + ["refused"] * 7
    assert len(path.read_text().splitlines()) == 1


def test_the_state_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TRANSDENOISER_STATE_DIR", str(tmp_path / "state"))
    assert ledger.ledger_path() == tmp_path / "state" / "certify-ledger.jsonl"
    monkeypatch.delenv("TRANSDENOISER_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert ledger.state_dir() == tmp_path / "xdg" / "transdenoiser"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ledger.state_dir() == tmp_path / "home" / ".local" / "state" / "transdenoiser"
