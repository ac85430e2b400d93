"""One certified accuracy: certify.summary.certified_accuracy, which the baselines' tables and the reproduction
script's figures call."""
from __future__ import annotations

import math

from certify.baseline_rows import RADII, certified_accuracy_by_radius
from certify.rundir import CertifyRecord
from certify.summary import certified_accuracy
from tests.test_reproduce import reproduce_part

# (prediction, label, radius): right at 0.5, right at 0 (a certificate without radius), an abstention, wrong at 1.0
ROWS = [(3, 3, 0.5), (2, 2, 0.0), (-1, 4, 0.0), (1, 0, 1.0)]
RECORDS = [CertifyRecord(i, label, prediction, radius, prediction == label, 0.1)
           for i, (prediction, label, radius) in enumerate(ROWS)]
EXPECTED = {0.0: 2 / 4, 0.25: 1 / 4, 0.5: 1 / 4, 0.75: 0.0, 2.0: 0.0}


def test_certified_accuracy_counts_correct_certificates_at_least_radius():
    for radius, expected in EXPECTED.items():
        assert certified_accuracy(RECORDS, radius) == expected
        rows = [{"radius": r.radius, "correct": int(r.correct)} for r in RECORDS]  # as read back from a TSV
        assert certified_accuracy(rows, radius) == expected
    assert math.isnan(certified_accuracy([], 0.0))


def test_baseline_table_and_reproduction_figures_use_the_same_definition():
    rows = [{"phan_radius": r.radius, "phan_correct": int(r.correct)} for r in RECORDS]
    table = certified_accuracy_by_radius(rows, "phan")
    assert table == {f"{radius:g}": certified_accuracy(RECORDS, radius) for radius in RADII}
    assert table["0"] == 0.5 and table["0.5"] == 0.25 and table["1"] == 0.0
    reproduce = reproduce_part("results")
    rows = [{"radius": r.radius, "correct": int(r.correct)} for r in RECORDS]
    by_radius = reproduce.accuracy_by_radius([rows], list(EXPECTED))  # one seed: its mean is the value
    assert [by_radius[f"{radius:g}"]["mean"] for radius in EXPECTED] == list(EXPECTED.values())
