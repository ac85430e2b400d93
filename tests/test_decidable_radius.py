"""A decide radius beyond what float64 Phi can tell from 1 (R / sigma above about 8.29) is one refusal, named the
same way everywhere: ``certify.sequential.max_decidable_radius`` at its boundary, the CLI (exit 2, one line, before
anything is loaded or written) and the API's request validation (400)."""
from __future__ import annotations

import dataclasses

import pytest
from scipy.stats import norm

from certify.sequential import max_decidable_radius
from serving.config import ServingConfig
from serving.validation import RADIUS_GRID, RequestError, check_radius, radius_on_grid
from transdenoiser.errors import UserError

SIGMAS = (0.12, 0.25, 0.5, 1.0, 0.01, 3.7)


@pytest.mark.parametrize("sigma", SIGMAS)
def test_largest_decidable_radius_is_the_last_grid_radius_below_one(sigma):
    largest = max_decidable_radius(sigma)
    assert largest == radius_on_grid(largest)  # a point of the server's 0.001 grid, as the server would send it
    assert float(norm.cdf(largest / sigma)) < 1.0  # its decide threshold is below 1 in float64 ...
    following = radius_on_grid(largest + RADIUS_GRID)
    assert following > largest and float(norm.cdf(following / sigma)) == 1.0  # ... the next grid radius's is not
    assert 8.2923 - RADIUS_GRID / sigma < largest / sigma <= 8.2924  # Phi is 1 from about 8.2924 on in float64


def test_tiny_sigma_gets_a_finer_step_instead_of_no_radius():
    largest = max_decidable_radius(1e-5)  # no multiple of 0.001 is decidable here: the step is refined
    assert 0 < largest < 1e-3 and float(norm.cdf(largest / 1e-5)) < 1.0
    with pytest.raises(UserError, match="finite and > 0"):
        max_decidable_radius(0.0)


def _cli(argv, capsys):
    from transdenoiser.cli import main

    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_refuses_an_undecidable_radius_in_one_line(random_classifier_dir, tmp_path, capsys):
    fast = ["certify", "--classifier", random_classifier_dir, "--sigma", "0.25", "--n0", "8", "--n-max", "40",
            "--batch-size", "64", "--alpha", "0.01", "--device", "cpu", "--max-index", "1"]
    code, _, err = _cli([*fast, "--radius", "2.5", "--out", tmp_path / "refused"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--radius 2.5 cannot be decided at --sigma 0.25" in err and "decided at this sigma is 2.073" in err
    assert not (tmp_path / "refused").exists()  # refused before anything is written
    code, _, err = _cli([*fast, "--radius", "2.074", "--out", tmp_path / "next"], capsys)  # the next grid radius
    assert code == 2 and "is 2.073" in err
    code, _, err = _cli([*fast, "--radius", "2.073", "--out", tmp_path / "largest"], capsys)  # the largest decides
    assert code == 0, err
    assert (tmp_path / "largest" / "certify.tsv").is_file()


def test_api_refuses_an_undecidable_radius_with_a_400():
    # max_n so large that the servable bound (all max_n votes for one class) lies beyond float64's Phi: the
    # decidable radius is then the binding limit (with max_n 10,000 the servable bound, 0.80 at sigma 0.25, is)
    config = dataclasses.replace(ServingConfig(sigma=0.25), max_n=10 ** 18)
    assert check_radius(2.073, config) == 2.073
    for asked, shown in ((2.5, "'radius' 2.5 cannot be decided"),
                         (2.0731, r"'radius' 2.0731 \(rounded up to the 0.001 grid: 2.074\) cannot be decided")):
        with pytest.raises(RequestError, match=shown) as caught:
            check_radius(asked, config)
        assert caught.value.status == 400 and "\n" not in caught.value.message
        assert caught.value.message.endswith("the largest radius that can be decided is 2.073")
    with pytest.raises(RequestError, match="the largest radius any request can certify"):
        check_radius(2.5, ServingConfig(sigma=0.25))  # a usual max_n: the servable bound refuses first
