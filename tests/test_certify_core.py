"""Statistics of the smoothing core against closed forms: radius, abstention, seeds, separate samples, packing."""
from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch
from scipy.stats import beta, norm
from torch import nn

from certify.core import (
    ABSTAIN,
    Smooth,
    certificate_from_counts,
    image_seed,
    max_certifiable_radius,
    padded_pass_size,
    prediction_from_counts,
)
from transdenoiser.errors import UserError

SHAPE = (1, 2, 2)


class Halfspace(nn.Module):
    """f(x) = 1[w.x > b] with ||w|| = 1: under N(0, sigma^2 I) noise, P[f(x + e) = 1] = Phi((w.x - b) / sigma)."""

    def __init__(self, b: float):
        super().__init__()
        self.w = nn.Parameter(torch.full((4,), 0.5), requires_grad=False)  # unit norm
        self.b = b

    def forward(self, x):
        score = x.flatten(1) @ self.w - self.b
        return torch.stack([-score, score], dim=1)


class CoinFlip(nn.Module):
    """Class 1 when the first pixel's noise is positive, else 0: at x = 0 both classes have probability 1/2."""

    def __init__(self):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)

    def forward(self, x):
        first = x.flatten(1)[:, 0]
        return torch.stack([-first, first], dim=1)


class Recorder(nn.Module):
    """Remembers every input row it evaluates, and answers class 0."""

    def __init__(self):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)
        self.rows: list[torch.Tensor] = []

    def forward(self, x):
        self.rows.append(x.flatten(1).clone())
        return torch.zeros(x.shape[0], 2) + torch.tensor([1.0, 0.0])


class FirstSeenVotes(nn.Module):
    """Votes class 0 for the first ``first`` samples it ever sees and class 1 afterwards."""

    def __init__(self, first: int):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)
        self.first, self.seen = first, 0

    def forward(self, x):
        position = torch.arange(self.seen, self.seen + x.shape[0])
        self.seen += x.shape[0]
        vote_one = (position >= self.first).float()
        return torch.stack([1 - vote_one, vote_one], dim=1)


def halfspace_for(p_one: float, sigma: float) -> Halfspace:
    """A halfspace whose smoothed probability of class 1 at x = 0 is ``p_one``."""
    return Halfspace(b=-sigma * norm.ppf(p_one))


def cp_lower(successes: int, trials: int, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper-Pearson lower bound, written out: the alpha quantile of Beta(k, n - k + 1)."""
    return 0.0 if successes == 0 else float(beta.ppf(alpha, successes, trials - successes + 1))


def radius_band(p: float, n: int, alpha: float, sigma: float, sds: float = 5.0) -> tuple[float, float, float]:
    """Radius at the expected count, and at the expected count -/+ ``sds`` Monte Carlo standard deviations."""
    mean, sd = n * p, math.sqrt(n * p * (1 - p))

    def radius(count: float) -> float:
        return sigma * float(norm.ppf(cp_lower(int(round(count)), n, alpha)))

    return radius(mean), radius(mean - sds * sd), radius(min(n, mean + sds * sd))


@pytest.mark.parametrize(("p_one", "expected_class"), [(0.9, 1), (0.2, 0)])
def test_radius_matches_closed_form(p_one, expected_class):
    sigma, n0, n, alpha = 0.5, 100, 4000, 0.001
    smooth = Smooth(halfspace_for(p_one, sigma), num_classes=2, sigma=sigma, batch_size=512, device="cpu")
    cert = smooth.certify(torch.zeros(SHAPE), n0, n, alpha, smooth.generator(1))
    p_true = p_one if expected_class == 1 else 1 - p_one
    expected, low, high = radius_band(p_true, n, alpha, sigma)
    assert cert.prediction == expected_class
    assert low <= cert.radius <= high, (cert, expected)
    assert abs(cert.count - n * p_true) <= 5 * math.sqrt(n * p_true * (1 - p_true))
    assert cert.p_lower < p_true  # the lower bound lies below the true probability
    assert cert.p_lower == pytest.approx(cp_lower(cert.count, n, alpha), rel=1e-9)
    assert cert.radius == pytest.approx(sigma * norm.ppf(cp_lower(cert.count, n, alpha)), rel=1e-9)
    # over several seeds the radius scatters around the radius at the expected count
    radii = [smooth.certify(torch.zeros(SHAPE), n0, n, alpha, smooth.generator(s)).radius for s in range(2, 8)]
    assert abs(np.mean(radii) - expected) < (high - low) / 4


def test_packed_images_each_match_their_own_closed_form():
    """Several images with different smoothed probabilities share forward passes, counts never mix."""
    sigma, n = 0.5, 3000
    smooth = Smooth(Halfspace(b=0.0), num_classes=2, sigma=sigma, batch_size=700, device="cpu")
    shifts = [-0.5, 0.0, 0.3, 0.8]  # w.x = shift (||w|| = 1 and w has equal entries)
    images = torch.stack([torch.full(SHAPE, s / 2) for s in shifts])
    counts = smooth.sample_counts_many(images, [n], [smooth.generator(10 + i) for i in range(4)])
    assert counts.shape == (4, 1, 2)
    for shift, count in zip(shifts, counts[:, 0, 1], strict=True):
        p = norm.cdf(shift / sigma)
        assert abs(count - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1e-9, (shift, count, n * p)


def test_abstains_on_a_tie():
    smooth = Smooth(CoinFlip(), num_classes=2, sigma=0.25, batch_size=500, device="cpu")
    for seed in range(3):
        cert = smooth.certify(torch.zeros(SHAPE), 100, 2000, 0.001, smooth.generator(seed))
        assert cert.prediction == ABSTAIN and cert.abstained and cert.radius == 0.0
        assert cert.p_lower < 0.5
        assert smooth.predict(torch.zeros(SHAPE), 2000, 0.001, smooth.generator(seed)) == ABSTAIN


def test_predict_returns_the_clear_winner():
    smooth = Smooth(halfspace_for(0.95, 0.5), num_classes=2, sigma=0.5, batch_size=500, device="cpu")
    assert smooth.predict(torch.zeros(SHAPE), 1000, 0.001, smooth.generator(0)) == 1


def test_same_seed_same_result_other_seed_other_noise():
    smooth = Smooth(halfspace_for(0.7, 0.5), num_classes=2, sigma=0.5, batch_size=300, device="cpu")
    x = torch.zeros(SHAPE)
    a = smooth.certify(x, 50, 2000, 0.01, smooth.image_generator(7, 3))
    b = smooth.certify(x, 50, 2000, 0.01, smooth.image_generator(7, 3))
    c = smooth.certify(x, 50, 2000, 0.01, smooth.image_generator(8, 3))
    assert a == b
    assert a.count != c.count
    assert image_seed(7, 3) == image_seed(7, 3) != image_seed(7, 4) != image_seed(8, 3)


def test_noise_does_not_depend_on_batch_size_or_companions():
    """An image's counts depend on its generator only: other batch sizes and other pack-mates give the same."""
    smooth = Smooth(halfspace_for(0.6, 0.5), num_classes=2, sigma=0.5, batch_size=1000, device="cpu")
    other = Smooth(smooth.classifier, num_classes=2, sigma=0.5, batch_size=37, device="cpu")
    x = torch.zeros(SHAPE)
    alone = smooth.certify(x, 30, 500, 0.01, smooth.image_generator(0, 5))
    packed = other.certify_many(torch.stack([x + 0.1, x, x - 0.2]), 30, 500, 0.01,
                                [other.image_generator(0, i) for i in (4, 5, 6)])
    assert packed[1] == alone


def test_selection_samples_are_not_reused_for_estimation():
    recorder = Recorder()
    smooth = Smooth(recorder, num_classes=2, sigma=0.3, batch_size=64, device="cpu")
    cert = smooth.certify(torch.zeros(SHAPE), 40, 200, 0.01, smooth.generator(0))
    rows = torch.cat(recorder.rows)
    assert rows.shape[0] == 240  # n0 + n noisy samples evaluated, each once
    assert torch.unique(rows, dim=0).shape[0] == 240  # all distinct: no sample evaluated twice
    assert (cert.n0, cert.n, cert.count) == (40, 200, 200)


def test_estimation_ignores_the_selection_votes():
    """The first n0 samples vote 0, all later ones vote 1: selection picks 0, estimation must find no 0 votes."""
    smooth = Smooth(FirstSeenVotes(first=50), num_classes=2, sigma=0.3, batch_size=32, device="cpu",
                    workers=1)  # the model's votes depend on the order it sees passes in
    cert = smooth.certify(torch.zeros(SHAPE), 50, 300, 0.01, smooth.generator(0))
    assert cert.count == 0 and cert.prediction == ABSTAIN


def test_decision_rules_from_counts():
    cert = certificate_from_counts(np.array([3, 97]), np.array([10, 990]), alpha=0.001, sigma=0.25)
    assert cert.prediction == 1
    assert cert.radius == pytest.approx(0.25 * norm.ppf(cp_lower(990, 1000, 0.001)), rel=1e-9)
    assert certificate_from_counts(np.array([60, 40]), np.array([480, 520]), 0.001, 0.25).prediction == ABSTAIN
    assert prediction_from_counts(np.array([500, 500, 0]), 0.05) == ABSTAIN
    assert prediction_from_counts(np.array([10, 900, 90]), 0.001) == 1
    # the largest radius: every estimation sample votes for the class
    assert max_certifiable_radius(0.25, 1000, 0.001) == pytest.approx(0.25 * norm.ppf(0.001 ** (1 / 1000)))


def test_denoiser_runs_before_the_classifier_on_noisy_pixels():
    """With a denoiser that shifts pixels by +1, the halfspace sees w.x + 2: class 1 almost surely."""
    class Shift(nn.Module):
        def __init__(self):
            super().__init__()
            self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)

        def forward(self, x):
            return x + 1.0

    smooth = Smooth(Halfspace(b=0.0), num_classes=2, sigma=0.25, denoiser=Shift(), batch_size=100, device="cpu")
    cert = smooth.certify(torch.zeros(SHAPE), 20, 200, 0.01, smooth.generator(0))
    assert cert.prediction == 1 and cert.count == 200


def test_channels_last_copy_leaves_the_callers_model_alone():
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 28 * 28, 10)).eval()
    smooth = Smooth(model, num_classes=10, sigma=0.25, device="cpu")
    assert smooth.memory_format == "channels_last"
    assert model[0].weight.is_contiguous()  # the caller's module is unchanged
    x = torch.rand(5, 1, 28, 28)
    with torch.inference_mode():
        assert torch.allclose(smooth.base_logits(x), model(x), atol=1e-5)


def test_parallel_forward_workers_give_the_same_counts():
    """Worker threads change only where passes run: counts equal the single-threaded ones, for a conv model."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 28 * 28, 10)).eval()
    images = torch.rand(3, 1, 28, 28)
    serial = Smooth(model, num_classes=10, sigma=0.5, batch_size=50, device="cpu", workers=1)
    parallel = Smooth(model, num_classes=10, sigma=0.5, batch_size=50, device="cpu", workers=3)
    gens = lambda smooth: [smooth.image_generator(0, i) for i in range(3)]  # noqa: E731
    expected = serial.sample_counts_many(images, [40, 430], gens(serial))
    assert parallel.workers == 3
    assert np.array_equal(parallel.sample_counts_many(images, [40, 430], gens(parallel)), expected)
    assert expected.sum() == 3 * 470
    parallel.close()


def test_pass_sizes_do_not_change_a_convolutional_pipeline_s_classes():
    """The split into passes (batch size, worker count) changes no logit of a channels-last CNN on CPU, so no count:
    the pass sizes are a matter of speed only."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                          nn.ReLU(), nn.Flatten(), nn.Linear(32 * 14 * 14, 10)).eval()
    samples = torch.rand(200, 1, 28, 28)
    reference = Smooth(model, 10, 0.25, batch_size=200, device="cpu", workers=1)
    assert reference.memory_format == "channels_last"
    expected = reference.base_logits(samples)
    for batch, workers in ((64, 2), (50, 1), (37, 2), (64, 3)):
        smooth = Smooth(model, 10, 0.25, batch_size=batch, device="cpu", workers=workers)
        parts = samples.split(smooth._pass_size(len(samples)))
        assert torch.equal(torch.cat([smooth.base_logits(part) for part in parts]), expected), (batch, workers)
        assert torch.equal(smooth.classify(samples), expected.argmax(dim=1))
        smooth.close()


def test_small_calls_are_split_so_every_worker_gets_a_pass():
    model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10)).eval()
    two = Smooth(model, num_classes=10, sigma=0.5, batch_size=1000, device="cpu", workers=2)
    one = Smooth(model, num_classes=10, sigma=0.5, batch_size=1000, device="cpu", workers=1)
    assert (two._pass_size(1000), two._pass_size(5000), two._pass_size(1), two._pass_size(0)) == (500, 834, 1, 1)
    assert one._pass_size(1000) == 1000
    for workers, batch in ((2, 64), (3, 50), (8, 1000)):
        smooth = Smooth(model, num_classes=10, sigma=0.5, batch_size=batch, device="cpu", workers=workers)
        for total in range(1, 2000, 7):  # every worker gets as many passes, none above the batch
            size = smooth._pass_size(total)
            passes = math.ceil(total / size)
            assert size <= batch and (passes % workers == 0 or passes == total), (workers, batch, total, size)
    assert Smooth(model, 10, 0.5, batch_size=64, device="cpu", workers=2)._pass_size(200) == 50  # the server's round
    samples = torch.rand(7, 1, 28, 28)
    assert torch.equal(two.classify(samples), one.classify(samples))
    two.close()


@pytest.mark.parametrize("batch", [1, 7, 64, 1000, 4096, 8192])
def test_eager_cuda_passes_are_padded_to_few_sizes_and_never_cut(batch):
    sizes = {padded_pass_size(size, batch, False, "cuda") for size in range(1, batch + 1)}
    step = max(1, batch // 16)
    assert len(sizes) <= 17 + step.bit_length()  # multiples of batch // 16 and batch itself; powers of two below
    for size in range(1, batch + 1):
        rows = padded_pass_size(size, batch, False, "cuda")
        assert size <= rows <= batch
        assert rows - size < max(step, size)  # at most one step, or doubling a pass smaller than a step
        assert padded_pass_size(size, batch, True, "cuda") == batch  # compiled: one static shape
        assert padded_pass_size(size, batch, False, "cpu") == size  # a CPU pass costs in proportion to its rows
    assert padded_pass_size(batch, batch, False, "cuda") == batch


def test_sync_free_counting_gives_the_counts_of_a_plain_loop():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10)).eval()
    smooth = Smooth(model, num_classes=10, sigma=0.5, batch_size=37, device="cpu", workers=1)
    images = torch.rand(3, 1, 28, 28)
    counts = smooth.sample_counts_many(images, [20, 90], [smooth.image_generator(0, i) for i in range(3)])
    for i in range(3):  # the same noise, drawn and counted one image and one phase at a time
        generator = smooth.image_generator(0, i)
        for phase, num in enumerate((20, 90)):
            noise = torch.randn((num, 1, 28, 28), generator=generator)
            predictions = model(noise.mul_(0.5).add_(images[i])).argmax(1)
            assert np.array_equal(counts[i, phase], np.bincount(predictions.numpy(), minlength=10))


def test_adaptive_answers_are_the_same_with_each_next_block_drawn_ahead():
    """On CUDA each image's next block is queued before its votes are read (lookahead): forced here on CPU, every
    decide and estimate answer is the one without it, and at most one block more is computed per image."""
    from certify.adaptive import adaptive_many, sequential_rule

    torch.manual_seed(3)
    model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10)).eval()
    smooth = Smooth(model, num_classes=10, sigma=0.5, batch_size=256, device="cpu", workers=1)
    images = torch.rand(6, 1, 28, 28)
    for rule in (sequential_rule("decide", 0.5, 3000, 0.01, radius=0.1),
                 sequential_rule("estimate", 0.5, 3000, 0.01)):
        runs = [adaptive_many(smooth, images, 50, rule, [smooth.image_generator(1, i) for i in range(6)],
                              lookahead=ahead) for ahead in (False, True)]
        for plain, ahead in zip(*runs, strict=True):
            assert (ahead.prediction, ahead.radius, ahead.p_lower, ahead.count, ahead.n, ahead.outcome) == (
                plain.prediction, plain.radius, plain.p_lower, plain.count, plain.n, plain.outcome)
            assert plain.computed <= ahead.computed <= max(plain.computed + 8, math.ceil(1.125 * plain.computed))


def test_adaptive_answers_are_the_same_when_launches_take_several_blocks():
    """On CUDA a launch takes consecutive blocks of each running image until it fills a pass (``fill``): forced here
    on CPU (with and without lookahead), every answer is the one with one block a launch; the consecutive blocks of
    one launch draw exactly the noise of one call per block, and more samples are evaluated past the stops."""
    from certify.adaptive import adaptive_many, sequential_rule

    torch.manual_seed(3)
    model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10)).eval()
    smooth = Smooth(model, num_classes=10, sigma=0.5, batch_size=256, device="cpu", workers=1)
    images = torch.rand(6, 1, 28, 28)
    # 5x5 images: 40 samples are not a whole number of the CPU generator's 16-value chunks, so drawing two blocks
    # as one draw would give other noise (on CUDA any two draw sizes do)
    small = Smooth(nn.Sequential(nn.Flatten(), nn.Linear(25, 10)).eval(), num_classes=10, sigma=0.5, device="cpu",
                   workers=1)
    pixels = torch.rand(2, 1, 5, 5)
    blocks = [(41, [16, 25]), (30, [30]), (50, [10, 20])]  # the last one drawn in full, 30 of it evaluated
    together = small.queue_counts_blocks(pixels, blocks, [small.image_generator(4, i) for i in range(2)])()
    for i in range(2):
        generator = small.image_generator(4, i)
        one_by_one = np.concatenate([small.sample_counts_segments(pixels[i:i + 1], size, segments, [generator])[0]
                                     for size, segments in blocks])
        assert np.array_equal(together[i], one_by_one)
    with pytest.raises(ValueError, match="do not fit"):  # a block before the last evaluated in part
        smooth.queue_counts_blocks(images[:1], [(40, [16]), (30, [30])], [smooth.image_generator(4, 0)])
    for rule in (sequential_rule("decide", 0.5, 3000, 0.01, radius=0.1),
                 sequential_rule("estimate", 0.5, 3000, 0.01)):
        plain = adaptive_many(smooth, images, 50, rule, [smooth.image_generator(1, i) for i in range(6)], fill=0)
        for ahead in (False, True):
            filled = adaptive_many(smooth, images, 50, rule, [smooth.image_generator(1, i) for i in range(6)],
                                   lookahead=ahead, fill=2000)
            for one, many in zip(plain, filled, strict=True):
                assert (many.prediction, many.radius, many.p_lower, many.count, many.n, many.outcome) == (
                    one.prediction, one.radius, one.p_lower, one.count, one.n, one.outcome)
            assert all(many.computed >= one.computed for one, many in zip(plain, filled, strict=True))
            assert sum(c.computed for c in filled) > sum(c.computed for c in plain)


@pytest.mark.skipif(sys.platform != "linux", reason="niceness per thread is Linux's")
def test_worker_threads_run_at_the_asked_niceness_with_the_same_counts():
    """``worker_nice`` lowers the forward-pass worker threads' priority (a server's event loop first); the caller's
    own niceness is untouched and the counts are those of workers at the caller's niceness."""
    import os
    import threading

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10)).eval()
    images = torch.rand(3, 1, 28, 28)
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    counts = {}
    for nice in (0, 3):
        smooth = Smooth(model, num_classes=10, sigma=0.5, batch_size=64, device="cpu", workers=2, worker_nice=nice)
        counts[nice] = smooth.sample_counts_many(images, [300], [smooth.image_generator(0, i) for i in range(3)])
        workers = list(smooth._pool._threads)  # this smoother's worker threads
        assert workers and all(os.getpriority(os.PRIO_PROCESS, t.native_id) == min(19, mine + nice) for t in workers)
        smooth.close()
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
    assert np.array_equal(counts[0], counts[3])
    for bad in (-1, 20, 2.5, True):
        with pytest.raises(UserError, match="worker_nice"):
            Smooth(model, num_classes=10, sigma=0.5, device="cpu", worker_nice=bad)


@pytest.mark.parametrize("noise", ["gaussian", "sound"])
def test_caller_drawing_noise_on_one_thread_leaves_counts_unchanged(noise):
    """With worker threads, the calling thread draws noise and counts on one torch thread: the same counts as the
    single-worker path, whose caller draws on all of them (pieces of 200 x 784 values: split across threads there),
    and the caller's thread count is given back, also when a pass fails."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 28 * 28, 10)).eval()
    images = torch.randint(0, 256, (2, 1, 28, 28)).float() / 255
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        serial = Smooth(model, num_classes=10, sigma=0.5, batch_size=64, device="cpu", workers=1, noise=noise)
        parallel = Smooth(model, num_classes=10, sigma=0.5, batch_size=64, device="cpu", workers=2, noise=noise)
        gens = lambda smooth: [smooth.image_generator(3, i) for i in range(2)]  # noqa: E731
        expected = serial.sample_counts_many(images, [100, 700], gens(serial))
        assert np.array_equal(parallel.sample_counts_many(images, [100, 700], gens(parallel)), expected)
        assert expected.sum() == 2 * 800
        assert torch.get_num_threads() == 2
        failing = Smooth(nn.Sequential(nn.Flatten(), nn.Linear(1, 2)), num_classes=2, sigma=0.5, device="cpu",
                         workers=2)
        with pytest.raises(RuntimeError):
            failing.sample_counts(images[0], 10, failing.generator(0))
        assert torch.get_num_threads() == 2
        parallel.close()
        failing.close()
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"workers": 0}, "workers must be"), ({"workers": "many"}, "workers must be"),
    ({"sigma": 0.0}, "sigma must be > 0"), ({"sigma": -1.0}, "sigma must be > 0"),
    ({"sigma": float("nan")}, "sigma must be > 0"), ({"batch_size": 0}, "batch size"),
    ({"memory_format": "weird"}, "memory format")])
def test_bad_smoothing_arguments(kwargs, message):
    args = {"sigma": 0.25} | kwargs
    with pytest.raises(UserError, match=message):
        Smooth(Halfspace(0.0), num_classes=2, device="cpu", **args)


@pytest.mark.parametrize(("n0", "n", "alpha", "message"), [
    (0, 10, 0.01, "n0 must be >= 1"), (10, 0, 0.01, "n must be >= 1"), (10, 10, 0.0, "alpha"), (10, 10, 1.0, "alpha")])
def test_bad_sampling_arguments(n0, n, alpha, message):
    smooth = Smooth(Halfspace(0.0), num_classes=2, sigma=0.25, device="cpu")
    with pytest.raises(UserError, match=message):
        smooth.certify(torch.zeros(SHAPE), n0, n, alpha)


# ----------------------------------------------------------------------------------------------- adaptive

def test_decide_certifies_easy_points_early_and_refuses_points_below_the_threshold():
    """Closed form pA = Phi(-b / sigma) at x = 0: certified at R iff pA >= Phi(R / sigma), i.e. R <= -b."""
    sigma, alpha = 0.25, 0.001
    smooth = Smooth(halfspace_for(0.9999, sigma), num_classes=2, sigma=sigma, batch_size=64, device="cpu")
    true_radius = sigma * norm.ppf(0.9999)  # 0.93
    easy = smooth.decide(torch.zeros(SHAPE), 0.5, 100, 100_000, alpha, smooth.generator(0))
    assert (easy.prediction, easy.radius, easy.outcome, easy.mode) == (1, 0.5, "certified", "decide")
    # all-votes bound: alpha / looks ** (1 / t) >= Phi(2) needs t >= ln(looks / alpha) / -ln Phi(2) ~ 430 samples
    assert easy.n < 1_000 and easy.samples == easy.n0 + easy.n and easy.p_lower >= norm.cdf(0.5 / sigma)
    # pA = 0.99 against the threshold 0.999 of a larger radius (about 500 samples for an oracle that knows pA)
    below = Smooth(halfspace_for(0.99, sigma), num_classes=2, sigma=sigma, batch_size=64, device="cpu")
    far = below.decide(torch.zeros(SHAPE), sigma * norm.ppf(0.999), 100, 100_000, alpha, below.generator(0))
    # not certified at R: the answer keeps the selected class (no abstention), radius 0
    assert (far.prediction, far.radius, far.outcome, far.certified) == (1, 0.0, "not_certified", False)
    assert not far.abstained and far.n < 10_000 and easy.certified is True
    budget = smooth.decide(torch.zeros(SHAPE), true_radius + 0.3, 100, 200, alpha, smooth.generator(0))
    assert budget.outcome == "budget_spent" and budget.n == 200 and budget.prediction == 1 and budget.certified is None


def test_adaptive_estimate_is_below_the_true_radius_and_near_fixed_n():
    sigma, alpha, p = 0.5, 0.001, 0.9
    smooth = Smooth(halfspace_for(p, sigma), num_classes=2, sigma=sigma, batch_size=256, device="cpu")
    cert = smooth.certify_adaptive(torch.zeros(SHAPE), 100, 20_000, alpha, smooth.generator(1), tolerance=0.05)
    true_radius = sigma * norm.ppf(p)
    assert cert.prediction == 1 and cert.outcome == "estimated"
    assert true_radius - 0.05 - 0.1 < cert.radius < true_radius
    assert cert.radius == pytest.approx(sigma * norm.ppf(cert.p_lower)) and cert.n < 20_000


def test_adaptive_estimation_ignores_the_selection_votes():
    for mode in ("decide", "estimate"):
        smooth = Smooth(FirstSeenVotes(first=50), num_classes=2, sigma=0.3, batch_size=32, device="cpu", workers=1)
        cert = (smooth.decide(torch.zeros(SHAPE), 0.1, 50, 300, 0.01, smooth.generator(0)) if mode == "decide"
                else smooth.certify_adaptive(torch.zeros(SHAPE), 50, 300, 0.01, smooth.generator(0)))
        assert cert.count == 0 and cert.mode == mode and cert.radius == 0.0
        if mode == "decide":  # not certified: the answer keeps the class the selection votes chose
            assert cert.prediction != ABSTAIN and cert.certified is not True
        else:
            assert cert.prediction == ABSTAIN


def test_adaptive_draws_each_sample_once_and_counts_them():
    recorder = Recorder()
    smooth = Smooth(recorder, num_classes=2, sigma=0.3, batch_size=64, device="cpu")
    cert = smooth.decide(torch.zeros(SHAPE), 0.2, 40, 5000, 0.01, smooth.generator(0))
    rows = torch.cat(recorder.rows)
    # every sample evaluated once: the selection, then whole blocks up to the stopping look's block
    assert rows.shape[0] == 40 + cert.computed and torch.unique(rows, dim=0).shape[0] == rows.shape[0]
    assert cert.samples == 40 + cert.n and cert.n <= cert.computed <= 1.125 * cert.n + 8


def test_packed_adaptive_images_match_their_own_runs_and_a_counts_driver():
    """Images packed together get what they get alone; a caller feeding counts gets the same answer."""
    from certify.core import sequential_rule
    from certify.streams import SequentialTest

    sigma = 0.25
    smooth = Smooth(Halfspace(b=0.0), num_classes=2, sigma=sigma, batch_size=64, device="cpu", workers=1)
    images = torch.stack([torch.full(SHAPE, v) for v in (-0.1, 0.0, 0.1, 0.2)])  # pA 0.34 .. 0.79
    packed = smooth.decide_many(images, 0.25, 30, 5000, 0.01, [smooth.generator(i) for i in range(4)])
    alone = [smooth.decide(images[i], 0.25, 30, 5000, 0.01, smooth.generator(i)) for i in range(4)]
    assert [(c.prediction, c.n, c.count) for c in packed] == [(c.prediction, c.n, c.count) for c in alone]
    rule = sequential_rule("decide", sigma, 5000, 0.01, radius=0.25)
    for i, expected in enumerate(alone):
        generator = smooth.generator(i)
        top = int(smooth.sample_counts(images[i], 30, generator).argmax())
        test = SequentialTest(rule)
        while not test.done:
            size, segments = test.next_block()
            counts = smooth.sample_counts_segments(images[i:i + 1], size, segments, [generator])[0]
            test.observe_block(counts[:, top])
        assert (test.successes, test.samples, test.computed) == (expected.count, expected.n, expected.computed)
