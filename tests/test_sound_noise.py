"""Sound smoothing (--sound-noise): the sampler's exact law, the radius of the quantised construction checked by
brute force on a small lattice, grid refusal, and a planted model that reads low-order bits (Voracek and Hein)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare, norm
from torch import nn

from certify import sound_noise
from certify.core import Smooth
from transdenoiser.errors import UserError

# A sampler whose table can never be made certain (an edge exactly on a multiple of 2^-B, e.g. edges at Phi(k / s)
# with Phi(0) = 1/2) raises the precision forever: the time limit turns that hang into a failure. Every test here
# takes under 4 s on 2 idle cores (the slowest 15 s while other jobs shared them).
pytestmark = pytest.mark.timeout(60)


def _chisquare_against_pmf(samples: np.ndarray, sigma: float) -> float:
    """p-value of samples against the discretized Gaussian, values beyond +-4 sigma pooled into two tail bins."""
    edge = int(math.ceil(4 * sigma * 255))
    values = np.arange(-edge, edge + 1)
    pmf = np.array([sound_noise.discretized_gaussian_pmf(int(k), sigma) for k in values])
    expected = np.concatenate([[norm.cdf((-edge - 0.5) / (sigma * 255))], pmf, [norm.sf((edge + 0.5) / (sigma * 255))]])
    observed = np.concatenate([[np.sum(samples < -edge)], [np.sum(samples == k) for k in values],
                               [np.sum(samples > edge)]])
    keep = expected * len(samples) >= 5  # chi-square's rule of thumb; the rest pooled into one bin
    observed = np.append(observed[keep], observed[~keep].sum())
    expected = np.append(expected[keep], expected[~keep].sum())
    return float(chisquare(observed, expected / expected.sum() * len(samples)).pvalue)


def test_sampler_draws_the_discretized_gaussian():
    sampler = sound_noise.DiscretizedGaussian(0.02)
    draws = sampler.sample((200_000,), torch.Generator().manual_seed(0)).numpy()
    assert draws.dtype == np.int32
    assert _chisquare_against_pmf(draws, 0.02) > 1e-3
    assert abs(draws.std() - 0.02 * 255) < 0.05  # sigma in grid steps (rounding adds 1/12 variance: negligible)


def _exact_cell_edges(sigma: float, half_width: int, bits: int) -> list[int]:
    """floor(F_k 2^bits) for the upper cell edges F_k = Phi((k + 1/2) / (255 sigma)), k = -half_width - 1 ..
    half_width, computed apart from the module: mpmath's erfc at 320 bits at (2k + 1) / (510 sigma), sigma the
    float64 exactly, each floor checked to be certain (the scaled edge more than 2^-100 from an integer)."""
    import mpmath

    floors = []
    with mpmath.workprec(320):
        sigma_exact = mpmath.mpf(sigma)  # the float64 sigma, exactly
        for k in range(-half_width - 1, half_width + 1):
            z = mpmath.mpf(2 * k + 1) / (510 * sigma_exact)
            scaled = mpmath.erfc(-z / mpmath.sqrt(2)) / 2 * mpmath.mpf(2) ** bits
            floor = int(mpmath.floor(scaled))
            assert min(scaled - floor, floor + 1 - scaled) > mpmath.mpf(2) ** -100  # the floor is certain
            floors.append(floor)
    return floors


@pytest.mark.parametrize("sigma", [0.02, 0.12, 0.25, 0.5, 1.0])
def test_cell_edges_are_the_exact_discretized_gaussian(sigma):
    """The sampler's integer thresholds are exactly floor(Phi((k + 1/2) h / sigma) 2^62), the cell edges of
    K = round(e / h): any edge moved (by a fraction of a level, or to Phi(k h / sigma)) changes some floor. Also
    within float64 rounding of scipy's norm.cdf (an independent implementation), and the table's range covers
    9.5 sigma: the first and last thresholds are 0 and 2^62 - 1 (the tails, resolved exactly, hold < 2^-62)."""
    sampler = sound_noise.DiscretizedGaussian(sigma)
    width, bits = sampler.half_width, sampler.uniform_bits
    assert width >= 9.5 * sigma * 255
    got = sampler.thresholds.tolist()
    assert len(got) == 2 * width + 2
    assert got == _exact_cell_edges(sigma, width, bits)
    ks = np.arange(-width - 1, width + 1)
    edges = norm.cdf((ks + 0.5) / (255 * sigma))
    assert np.max(np.abs(np.array(got, dtype=np.float64) / 2.0 ** bits - edges)) < 1e-15
    assert got[0] == 0 and got[-1] == 2 ** bits - 1


def test_cell_edges_guide_table_places_buckets_by_the_exact_edges():
    """Every guide bucket the table places directly (no search) has all its uniforms in the one cell the exact
    edges give, and no edge inside it; every other bucket holds an edge or a tail."""
    sigma = 0.25
    sampler = sound_noise.DiscretizedGaussian(sigma)
    exact = np.array(_exact_cell_edges(sigma, sampler.half_width, sampler.uniform_bits), dtype=np.int64)
    starts = np.arange(1 << sampler.guide_bits, dtype=np.int64) << sampler.guide_shift
    ends = starts + (1 << sampler.guide_shift) - 1
    cell = np.searchsorted(exact, starts, side="right") - sampler.half_width - 1
    no_edge = np.searchsorted(exact, starts, side="left") == np.searchsorted(exact, ends, side="right")
    placed = no_edge & (cell > -sampler.half_width - 1) & (cell <= sampler.half_width)
    guide = sampler.guide.numpy()
    assert np.array_equal(~np.isnan(guide), placed)
    assert np.array_equal(guide[placed], cell[placed].astype(np.float32))
    assert placed.mean() > 0.99


@pytest.mark.parametrize("seed", range(6))
def test_cell_edges_settle_straddling_draws_exactly(seed):
    """A 10-bit uniform U equal to a threshold straddles an edge; :meth:`_resolve` draws more 10-bit uniforms until
    V's interval lies in one cell. Replaying the same draws against the exact edges gives the same cell."""
    import mpmath

    sigma, bits = 0.02, 10
    sampler = sound_noise.DiscretizedGaussian(sigma, uniform_bits=bits)
    rng = np.random.default_rng(seed)
    for u in rng.choice(sampler.thresholds.numpy()[1:-1], size=5, replace=False).tolist():
        got = sampler._resolve(u, torch.Generator().manual_seed(seed), "cpu")
        replay, low, width = torch.Generator().manual_seed(seed), u, bits
        with mpmath.workprec(320):
            def edge(k):  # Phi((k + 1/2) / (255 sigma)), the upper edge of cell k
                return mpmath.erfc(-mpmath.mpf(2 * k + 1) / (510 * mpmath.mpf(sigma)) / mpmath.sqrt(2)) / 2

            while True:
                v_low, v_high = mpmath.mpf(low) / 2 ** width, mpmath.mpf(low + 1) / 2 ** width
                cell = next(k for k in range(-sampler.half_width - 1, sampler.half_width + 2) if edge(k) > v_low)
                if v_high <= edge(cell):
                    break
                low = (low << bits) | int(torch.randint(0, 1 << bits, (1,), generator=replay, dtype=torch.int64))
                width += bits
        assert got == cell, (u, got, cell)


@pytest.mark.parametrize("head_bits", [30, 6])
def test_straddling_draws_are_resolved_exactly(monkeypatch, head_bits):
    """With 10-bit uniforms about one draw in ten lands on a table threshold (or a tail) and is resolved with more
    bits: the law is still exact, while the table alone would be off by up to 2^-10 per cell. With 6 head bits,
    the 4 low bits are drawn lazily, only for the draws the guide table cannot place."""
    monkeypatch.setattr(sound_noise, "HEAD_BITS", head_bits)
    sampler = sound_noise.DiscretizedGaussian(0.02, uniform_bits=10)
    assert sampler.head_bits == min(head_bits, 10)
    assert sampler.guide.isnan().float().mean() > 0.03  # the slow path is exercised
    draws = sampler.sample((4000,), torch.Generator().manual_seed(1)).numpy()
    assert _chisquare_against_pmf(draws, 0.02) > 1e-3


def test_same_generator_same_noise():
    sampler = sound_noise.sampler(0.25)
    first = sampler.sample((3, 5), torch.Generator().manual_seed(7))
    assert torch.equal(first, sampler.sample((3, 5), torch.Generator().manual_seed(7)))


def test_grid_levels_accepts_the_grid_and_refuses_anything_else():
    image = torch.tensor([0, 1, 128, 255], dtype=torch.float32).div(255).view(1, 2, 2)
    assert sound_noise.grid_levels(image).flatten().tolist() == [0, 1, 128, 255]
    with pytest.raises(UserError, match="8-bit grid"):
        sound_noise.grid_levels(image + 0.001)
    with pytest.raises(UserError, match=r"in \[0, 1\]"):
        sound_noise.grid_levels(image * 2)
    with pytest.raises(UserError, match="NaN"):
        sound_noise.grid_levels(torch.full((1, 2, 2), float("nan")))
    with pytest.raises(UserError, match="noise must be one of"):
        sound_noise.check_noise_kind("uniform")


def _exact_probabilities(classes: np.ndarray, center: tuple[int, int], sigma: float, num_classes: int) -> np.ndarray:
    """P[f(x + K) = c] for x at grid ``center`` of a 2-pixel lattice image, K exactly discretized Gaussian,
    f given by the table ``classes`` over levels (the lattice outside the table counts for class 0)."""
    half = classes.shape[0] // 2
    offsets = np.arange(-half, half + 1)
    probs = np.zeros(num_classes)
    pmf = {int(k): sound_noise.discretized_gaussian_pmf(int(k), sigma) for k in range(-2 * half, 2 * half + 1)}
    for a, b in itertools.product(offsets, offsets):
        ka, kb = a - center[0], b - center[1]
        probs[classes[a + half, b + half]] += pmf.get(int(ka), 0.0) * pmf.get(int(kb), 0.0)
    probs[0] += 1.0 - probs.sum()  # mass outside the table (below 1e-12 here)
    return probs


def test_certified_radius_holds_for_the_quantised_construction_by_brute_force():
    """Cohen's bound Phi^-1(p(x')) >= Phi^-1(p(x)) - ||x' - x|| / sigma, checked exactly for every pair of centres
    of a 2-pixel lattice and base classifiers of several shapes (half-planes through odd points, random tables):
    the certificate sigma * Phi^-1(pA) of :func:`certified_radius` is never contradicted on the lattice."""
    sigma, half = 0.008, 16  # about 2 grid steps of noise; the table covers 8 sigma around every centre used
    grid = np.arange(-half, half + 1)
    a, b = np.meshgrid(grid, grid, indexing="ij")
    rng = np.random.default_rng(0)
    angles_offsets = ((0.3, 0.5), (1.1, -0.2), (2.0, 1.7))
    tables = [((a * math.cos(t) + b * math.sin(t)) > off).astype(int) for t, off in angles_offsets]
    tables += [(rng.random(a.shape) < 0.5).astype(int), ((a ** 2 + b ** 2) < 9).astype(int)]
    centres = [(i, j) for i in range(-2, 3) for j in range(-2, 3)]
    worst = math.inf
    for table in tables:
        probs = {c: _exact_probabilities(table, c, sigma, 2) for c in centres}
        for x, y in itertools.product(centres, centres):
            distance = math.dist(x, y) / 255
            for c in (0, 1):
                p_x, p_y = min(max(probs[x][c], 1e-15), 1 - 1e-15), min(max(probs[y][c], 1e-15), 1 - 1e-15)
                worst = min(worst, norm.ppf(p_y) - (norm.ppf(p_x) - distance / sigma))
                if p_x > 0.5 and distance < sound_noise.certified_radius(p_x, sigma):
                    assert p_y > 0.5  # g(x') is the certified class
    assert worst > -1e-6  # the bound is never violated (beyond float64 rounding of the probabilities)
    assert worst < 0.05  # and some pair nearly attains it: the check is not vacuous


def test_certified_radius_is_cohens_and_zero_without_majority():
    assert sound_noise.certified_radius(0.5, 0.25) == 0.0
    assert sound_noise.certified_radius(norm.cdf(2.0), 0.25) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        sound_noise.certified_radius(1.5, 0.25)


class LevelClassifier(nn.Module):
    """Class = (first pixel's level k, read back from the float input) mod 3: counts under sound noise are then
    exact sums of discretized Gaussian probabilities."""

    def __init__(self):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)

    def forward(self, x):
        level = torch.round(x.flatten(1)[:, 0].double() * 255).long()
        return nn.functional.one_hot(level % 3, 3).float()


def test_smooth_with_sound_noise_sees_exactly_the_grid_law():
    sigma, start = 0.01, 40
    smooth = Smooth(LevelClassifier(), 3, sigma, batch_size=512, workers=1, noise="sound")
    image = torch.full((1, 2, 2), start / 255)
    counts = smooth.sample_counts(image, 30_000, torch.Generator().manual_seed(3))
    expected = np.zeros(3)
    for k in range(-40, 41):
        expected[(start + k) % 3] += sound_noise.discretized_gaussian_pmf(k, sigma)
    assert chisquare(counts, expected / expected.sum() * counts.sum()).pvalue > 1e-3
    with pytest.raises(UserError, match="8-bit grid"):
        smooth.sample_counts(image + 1e-3, 10)
    with pytest.raises(UserError, match="noise must be one of"):
        Smooth(LevelClassifier(), 3, sigma, noise="float64")


class LowBitDetector(nn.Module):
    """A planted base model that reads low-order bits (after Voracek and Hein): class 0 when some pixel is a
    nonzero float below 2^-9 that is not a multiple of 2^-32, else class 1.

    Under float32 noise around a black image (x = 0) the noisy pixels are the noise itself, whose small values
    carry bits far below 2^-32: some pixel of 784 shows them with probability about 0.96. Around the image of
    level 1 everywhere (x' = 1/255, at L2 distance 28/255 = 0.11) every noisy pixel is a float32 sum
    fl(1/255 + e) whose bits stop at 2^-32 or above, so the detector never fires. A model that sees its input
    only through integer levels (sound noise) cannot tell the two apart by their bits."""

    def __init__(self):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)

    def forward(self, x):
        x = x.flatten(1)
        scaled = x * 2.0 ** 32
        fires = ((x != 0) & (x.abs() < 2.0 ** -9) & (scaled != torch.round(scaled))).any(dim=1)
        return torch.stack([fires.float(), (~fires).float()], dim=1)


@pytest.mark.parametrize("noise", ["gaussian", "sound"])
def test_planted_low_bit_model(noise):
    sigma, alpha = 0.25, 0.001
    smooth = Smooth(LowBitDetector(), 2, sigma, batch_size=2000, workers=1, noise=noise)
    black = torch.zeros(1, 28, 28)
    grey = torch.full((1, 28, 28), 1 / 255)  # on the grid, 28/255 = 0.11 away
    distance = float((grey - black).norm())
    certificate = smooth.certify(black, 100, 2000, alpha, torch.Generator().manual_seed(0))
    at_grey = smooth.certify(grey, 100, 2000, alpha, torch.Generator().manual_seed(1))
    if noise == "gaussian":  # today's sampler is fooled: a certificate that an on-grid image within it refutes
        assert certificate.prediction == 0 and certificate.radius > 3 * distance
        assert at_grey.prediction == 1 and at_grey.p_lower > 0.99
    else:  # the sound sampler: the detector never fires, both images get the same class, as the theorem says
        assert certificate.prediction == at_grey.prediction == 1
        assert certificate.radius > distance


def test_sound_noise_is_recorded_and_runs_of_other_noise_never_mix(random_classifier_dir, tmp_path, capsys):
    import json

    from transdenoiser.cli import main

    def run(argv):
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return code, captured.err

    fast = ["--classifier", random_classifier_dir, "--sigma", "0.25", "--n0", "8", "--n", "40", "--batch-size", "64",
            "--alpha", "0.01", "--device", "cpu", "--max-index", "2"]
    sound, plain = tmp_path / "sound", tmp_path / "plain"
    code, err = run(["certify", *fast, "--sound-noise", "--out", sound])
    assert code == 0, err
    summary = json.loads((sound / "summary.json").read_text())
    assert summary["settings"]["noise"] == "sound"
    assert "sound noise (inputs on the 8-bit grid" in (sound / "report.md").read_text()
    code, err = run(["certify", *fast, "--out", sound])  # resuming without the flag is another run
    assert code == 2 and "noise 'sound' there, 'gaussian' now" in err
    code, err = run(["certify", *fast, "--out", plain])
    assert code == 0, err
    assert json.loads((plain / "summary.json").read_text())["settings"]["noise"] == "gaussian"
    code, err = run(["report", sound, plain, "--out", tmp_path / "overlay"])
    assert code == 2 and "noise 'sound'" in err and len(err.strip().splitlines()) == 1
    shards = []
    for index, flag in ((0, ["--sound-noise"]), (1, [])):
        shards.append(tmp_path / f"shard{index}")
        code, err = run(["certify", *fast, *flag, "--shard", f"{index}/2", "--out", shards[-1]])
        assert code == 0, err
    code, err = run(["certify-merge", *shards, "--out", tmp_path / "merged"])
    assert code == 2 and "refusing to merge" in err and "noise" in err


def test_noisy_copies_are_the_sampled_noise_whatever_the_threads():
    """(levels + K) / 255 with K from :meth:`sample` on the same generator, identical with one CPU thread (one
    chunk) and with several (chunks under torch's grain size)."""
    sampler = sound_noise.DiscretizedGaussian(0.02, uniform_bits=12)  # many draws need their low bits
    levels = torch.randint(0, 256, (1, 8, 8), dtype=torch.int32)
    expected = (sampler.sample((700, 1, 8, 8), torch.Generator().manual_seed(4)) + levels).float() / 255
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            got = sampler.noisy(levels, 700, torch.Generator().manual_seed(4), torch.float32)
            assert torch.equal(got, expected)
    finally:
        torch.set_num_threads(threads)
