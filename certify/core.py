"""Randomized smoothing (Cohen, Rosenfeld and Kolter, 2019) over an optional denoiser and a frozen classifier.

The smoothed classifier is g(x) = argmax_c P[f(D(x + e)) = c], e ~ N(0, sigma^2 I), where D is the denoiser
(identity when absent), f the base classifier, and pixels are in [0, 1]: noise is added before any normalisation.

- ``predict``: the top class by n noisy samples, or ABSTAIN unless a two-sided binomial test
  between the two top counts rejects a tie at level alpha (Cohen's PREDICT; the test is scipy's).
- ``certify``: select the top class with n0 samples, then estimate with n fresh samples a
  one-sided (1 - alpha) Clopper-Pearson lower bound pA (statsmodels, ``method="beta"``);
  certified L2 radius sigma * Phi^-1(pA), or ABSTAIN when pA < 1/2 (Cohen's CERTIFY).
The selection and estimation samples are never shared.

Speed without changing the statistics: noisy samples of several images share forward passes (``sample_counts_many``),
noise is drawn on the device under ``torch.inference_mode``, convolutional models run channels-last on CPU, and on a
multi-core CPU passes run in worker threads of one torch thread each. Counts are sums: they do not depend on the order
in which passes finish. Each image's noise comes from its own generator in pieces whose size depends only on the image
shape, so it does not depend on the batch size, the images packed with it, or sharding. Noise and counts are float32
/ int64 (``noise="sound"``: exact integer grid noise, :mod:`certify.sound_noise`); the forward pass runs at
``precision`` (float32, or bfloat16 / float16 autocast), optionally ``torch.compile``d: a slightly different base
classifier, certified exactly as validly (:mod:`certify.numerics`, docs/CERTIFY.md).
"""
from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import binomtest, norm
from statsmodels.stats.proportion import proportion_confint
from torch import nn

from certify import numerics, sound_noise
from transdenoiser.errors import UserError

ABSTAIN = -1
NOISE_PIECE_ELEMENTS = 1 << 20  # noise is drawn per image in pieces of about this many numbers (4 MiB of float32)
MEMORY_FORMATS = ("auto", "channels_last", "contiguous")
MAX_AUTO_WORKERS = 8  # ``workers="auto"`` on CPU: one worker per torch thread, at most this many


@dataclass(frozen=True)
class Certificate:
    """Result of :meth:`Smooth.certify` for one image; ``radius`` is an L2 radius in [0,1]-pixel units."""
    prediction: int  # class index, or ABSTAIN
    radius: float  # 0.0 when abstaining
    p_lower: float  # one-sided Clopper-Pearson lower bound on P[f(D(x+e)) = prediction]
    count: int  # estimation samples that voted for the selected class
    n0: int
    n: int

    @property
    def abstained(self) -> bool:
        return self.prediction == ABSTAIN


def clopper_pearson_lower(successes: int, trials: int, alpha: float) -> float:
    """One-sided (1 - alpha) lower confidence bound on a binomial proportion (Clopper-Pearson)."""
    if successes == 0:
        return 0.0
    return float(proportion_confint(successes, trials, alpha=2 * alpha, method="beta")[0])


def radius_from_p_lower(p_lower: float, sigma: float) -> float:
    """Certified L2 radius sigma * Phi^-1(pA) (Cohen et al., Theorem 1 with pB = 1 - pA)."""
    return float(sigma * norm.ppf(p_lower))


def max_certifiable_radius(sigma: float, n: int, alpha: float) -> float:
    """The largest radius ``certify`` can return with n estimation samples: every sample votes for the class."""
    return radius_from_p_lower(clopper_pearson_lower(n, n, alpha), sigma)


def validate_sampling(n0: int | None, n: int, alpha: float) -> None:
    if n0 is not None and n0 < 1:
        raise UserError(f"n0 must be >= 1, got {n0}")
    if n < 1:
        raise UserError(f"n must be >= 1, got {n}")
    if not 0 < alpha < 1:
        raise UserError(f"alpha must lie strictly between 0 and 1, got {alpha}")


def image_seed(seed: int, idx: int) -> int:
    """Seed of the generator for image ``idx`` of a run seeded with ``seed`` (NumPy's SeedSequence mixing).

    Every image gets its own independent noise stream, so a result depends on (seed, idx) only,
    never on which process, shard or pack the image was certified in.
    """
    if idx < 0:
        raise UserError(f"image index must be >= 0, got {idx}")
    words = np.random.SeedSequence([seed % 2**64, idx]).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])  # < 2**63: a valid torch seed


def certificate_from_counts(selection: np.ndarray, estimation: np.ndarray, alpha: float,
                            sigma: float) -> Certificate:
    """Cohen's CERTIFY decision: the class comes from ``selection`` counts, its bound from ``estimation`` counts."""
    n0, n = int(selection.sum()), int(estimation.sum())
    top = int(selection.argmax())
    count = int(estimation[top])
    p_lower = clopper_pearson_lower(count, n, alpha)
    if p_lower < 0.5:
        return Certificate(ABSTAIN, 0.0, p_lower, count, n0, n)
    return Certificate(top, radius_from_p_lower(p_lower, sigma), p_lower, count, n0, n)


def prediction_from_counts(counts: np.ndarray, alpha: float) -> int:
    """Cohen's PREDICT decision: the top class unless a two-sided binomial test cannot tell it from the runner-up."""
    top2 = counts.argsort()[::-1][:2]
    count_a, count_b = int(counts[top2[0]]), int(counts[top2[1]])
    if binomtest(count_a, count_a + count_b, p=0.5).pvalue > alpha:
        return ABSTAIN
    return int(top2[0])


def _has_conv2d(*models: nn.Module | None) -> bool:
    return any(isinstance(m, nn.modules.conv._ConvNd) and m.weight.dim() == 4
               for model in models if model is not None for m in model.modules())


class _BasePipeline(nn.Module):
    """f(D(x)): the denoiser (if any) then the classifier, as one module (what ``torch.compile`` compiles)."""

    def __init__(self, classifier: nn.Module, denoiser: nn.Module | None):
        super().__init__()
        self.classifier = classifier
        self.denoiser = denoiser

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.denoiser(x) if self.denoiser is not None else x)


class Smooth:
    """A smoothed classifier over ``classifier`` with ``denoiser`` in front (both frozen, eval mode).

    ``sigma``: standard deviation of the Gaussian noise, in [0,1]-pixel units.
    ``batch_size``: noisy samples evaluated per forward pass (several images' samples share a pass).
    ``memory_format``: ``auto`` runs convolutional models in channels-last format on CPU (about 2x
    faster there), and on CUDA only when compiled (:func:`certify.numerics.default_memory_format`);
    the models are then copied, never changed in place.
    ``workers``: forward passes run side by side in this many threads, the torch CPU threads shared
    out among them; ``auto`` is one per torch thread (at most 8) on CPU and 1 on other devices.
    ``precision``: ``fp32`` (default), ``bf16`` or ``fp16``: the forward pass runs under autocast to that
    dtype (refused, one line, where this torch cannot do it on the device). ``compile``: run the pipeline
    through ``torch.compile``. Both make the base classifier a (slightly) different function: certificates
    are about the pipeline as run (docs/CERTIFY.md, "Precision and compilation"). ``noise``: ``gaussian``
    (float32 ``x + sigma * randn``) or ``sound`` (8-bit grid inputs, exact integer noise: :mod:`certify.sound_noise`).
    """

    def __init__(self, classifier: nn.Module, num_classes: int, sigma: float, denoiser: nn.Module | None = None,
                 batch_size: int = 1000, device: torch.device | str | None = None, memory_format: str = "auto",
                 workers: int | str = "auto", precision: str = "fp32", compile: bool = False, noise: str = "gaussian"):
        if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
            raise UserError(f"sigma must be > 0, got {sigma}")
        if num_classes < 2:
            raise UserError(f"num_classes must be >= 2, got {num_classes}")
        if batch_size < 1:
            raise UserError(f"batch size must be >= 1, got {batch_size}")
        if memory_format not in MEMORY_FORMATS:
            raise UserError(f"memory format must be one of {', '.join(MEMORY_FORMATS)}, got {memory_format!r}")
        if workers != "auto" and not (isinstance(workers, int) and workers >= 1):
            raise UserError(f"workers must be 'auto' or an integer >= 1, got {workers!r}")
        if not isinstance(compile, bool):
            raise UserError(f"compile must be true or false, got {compile!r}")
        self.device = torch.device(device) if device is not None else next(classifier.parameters()).device
        self.precision = numerics.check_precision_supported(self.device, precision)
        self.compile = compile
        self.noise = sound_noise.check_noise_kind(noise)
        self._grid_noise = sound_noise.sampler(float(sigma)) if noise == "sound" else None
        classifier = classifier.to(self.device).eval()
        denoiser = denoiser.to(self.device).eval() if denoiser is not None else None
        if memory_format == "auto":
            memory_format = numerics.default_memory_format(self.device, compile, _has_conv2d(classifier, denoiser))
        if memory_format == "channels_last":
            classifier = copy.deepcopy(classifier).to(memory_format=torch.channels_last)
            if denoiser is not None:
                denoiser = copy.deepcopy(denoiser).to(memory_format=torch.channels_last)
        self.classifier = classifier
        self.denoiser = denoiser
        self.memory_format = memory_format
        self.base_pipeline = _BasePipeline(classifier, denoiser).eval()  # eager, whatever ``compile`` says
        self._forward = numerics.compile_module(self.base_pipeline) if compile else self.base_pipeline
        self.num_classes = num_classes
        self.sigma = float(sigma)
        self.batch_size = batch_size
        if workers == "auto":
            workers = min(torch.get_num_threads(), MAX_AUTO_WORKERS) if self.device.type == "cpu" else 1
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            threads_each = max(1, torch.get_num_threads() // self.workers)
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="smooth-forward",
                                            initializer=torch.set_num_threads, initargs=(threads_each,))
        return self._pool

    def close(self) -> None:
        """Stop the worker threads (they are started again if needed)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _predict_classes(self, batch: torch.Tensor) -> torch.Tensor:
        return self.base_logits(batch).argmax(dim=1)

    def _pass_size(self, total: int) -> int:
        """Samples per forward pass for ``total`` samples: ``batch_size``, or less so that every worker gets
        a pass when there are fewer than ``workers`` passes' worth (one pass would leave the others idle)."""
        if self.workers == 1 or self.compile:  # compiled passes are padded to batch_size anyway
            return self.batch_size
        return max(1, min(self.batch_size, math.ceil(total / self.workers)))

    def classify(self, samples: torch.Tensor) -> torch.Tensor:
        """The base pipeline's class for each of ``samples`` (N, C, H, W), in forward passes of at most
        ``batch_size`` samples spread over the workers; returned in the order of ``samples``."""
        parts = samples.split(self._pass_size(len(samples)))
        if self.workers > 1 and len(parts) > 1:
            return torch.cat(list(self._executor().map(self._predict_classes, parts)))
        return torch.cat([self._predict_classes(part) for part in parts])

    def generator(self, seed: int) -> torch.Generator:
        """A generator on this smoother's device: same seed, same noise, same result."""
        return torch.Generator(device=self.device).manual_seed(seed)

    def image_generator(self, seed: int, idx: int) -> torch.Generator:
        """The generator of image ``idx`` in a run seeded with ``seed`` (see :func:`image_seed`)."""
        return self.generator(image_seed(seed, idx))

    def describe(self) -> str:
        """How the base classifier is run, in one line (precision, compilation, memory format)."""
        return numerics.describe(self.precision, self.compile, self.memory_format, self.noise)

    @torch.inference_mode()
    def base_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the base pipeline f(D(x)) for a batch ``x`` (no noise added here), as run: at ``precision``
        (returned as float32) and compiled if asked."""
        if not self.compile:
            return self._run(x)
        # Compiled: every pass is padded to ``batch_size`` samples, so one static-shape graph computes every sample
        # (no recompilation per tail size, and never an eager fallback past torch's recompile limit).
        logits = []
        for part in x.split(self.batch_size):
            size = part.shape[0]
            if size < self.batch_size:
                part = torch.cat([part, part.new_zeros((self.batch_size - size, *part.shape[1:]))])
            logits.append(self._run(part)[:size])
        return torch.cat(logits)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        if self.memory_format == "channels_last" and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with numerics.autocast(self.device, self.precision):
            logits = self._forward(x)
        return logits.float()

    @torch.inference_mode()
    def sample_counts(self, x: torch.Tensor, num: int, generator: torch.Generator | None = None) -> np.ndarray:
        """Class counts of f(D(x + e)) over ``num`` noise draws for one image ``x`` (C, H, W)."""
        return self.sample_counts_many(x.unsqueeze(0), [num], [generator])[0, 0]

    @torch.inference_mode()
    def sample_counts_many(self, images: torch.Tensor, phases: Sequence[int],
                           generators: Sequence[torch.Generator | None]) -> np.ndarray:
        """Class counts for several images and several sampling phases, packed into shared forward passes.

        ``images`` (B, C, H, W); ``phases`` the number of noise draws in each phase (e.g. ``[n0, n]``);
        ``generators`` one per image. Returns int64 counts of shape (B, len(phases), num_classes).
        Each image draws its phases in order from its own generator, fresh draws each time: phase
        samples are never shared. The noise depends on the generator alone (pieces of a fixed
        size per image shape), not on ``batch_size`` or on the other images.
        """
        if images.dim() != 4:
            raise UserError(f"expected a batch of images (B, C, H, W), got shape {tuple(images.shape)}")
        if len(generators) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(generators)} generators")
        images = images.to(self.device)
        levels = sound_noise.grid_levels(images) if self._grid_noise is not None else None  # refuses off-grid input
        num_slots = images.shape[0] * len(phases)
        counts = torch.zeros(num_slots * self.num_classes, dtype=torch.long, device=self.device)
        piece = max(1, NOISE_PIECE_ELEMENTS // images[0].numel())
        pass_size = self._pass_size(images.shape[0] * sum(int(num) for num in phases))
        pending: list[torch.Tensor] = []  # noisy samples waiting for a forward pass
        pending_slots: list[tuple[int, int]] = []  # (slot, number of samples), in the order of ``pending``
        in_flight: deque[tuple[Future | torch.Tensor, torch.Tensor]] = deque()  # (predictions, slot of each)

        def collect(limit: int) -> None:
            while len(in_flight) > limit:
                predictions, slot_ids = in_flight.popleft()
                if isinstance(predictions, Future):
                    predictions = predictions.result()
                counts.add_(torch.bincount(slot_ids * self.num_classes + predictions, minlength=counts.numel()))

        def forward(take: int) -> None:
            batch = pending[0] if len(pending) == 1 else torch.cat(pending)
            slots, sizes, left = [], [], take
            while left > 0:
                slot, size = pending_slots[0]
                used = min(size, left)
                slots.append(slot)
                sizes.append(used)
                left -= used
                if used == size:
                    pending_slots.pop(0)
                else:
                    pending_slots[0] = (slot, size - used)
            slot_ids = torch.repeat_interleave(torch.tensor(slots, device=self.device),
                                               torch.tensor(sizes, device=self.device))
            if self.workers > 1:
                collect(self.workers)  # at most workers + 1 passes in flight: bounded memory
                in_flight.append((self._executor().submit(self._predict_classes, batch[:take]), slot_ids))
            else:
                in_flight.append((self._predict_classes(batch[:take]), slot_ids))
                collect(0)
            pending.clear()
            if take < batch.shape[0]:
                pending.append(batch[take:])

        queued = 0
        for j in range(images.shape[0]):
            for p, num in enumerate(phases):
                remaining = int(num)
                while remaining > 0:
                    size = min(piece, remaining)
                    if levels is not None:  # exact: integer levels plus integer noise, then one division
                        pending.append(self._grid_noise.noisy(levels[j], size, generators[j], images.dtype))
                    else:
                        noise = torch.randn((size, *images.shape[1:]), generator=generators[j], device=self.device,
                                            dtype=images.dtype)
                        pending.append(noise.mul_(self.sigma).add_(images[j]))
                    pending_slots.append((j * len(phases) + p, size))
                    queued += size
                    remaining -= size
                    while queued >= pass_size:
                        forward(pass_size)
                        queued -= pass_size
        if queued > 0:
            forward(queued)
        collect(0)
        return counts.view(images.shape[0], len(phases), self.num_classes).cpu().numpy()

    def predict(self, x: torch.Tensor, n: int, alpha: float, generator: torch.Generator | None = None) -> int:
        """Top class of the smoothed classifier at ``x``, or ABSTAIN; wrong with probability at most alpha."""
        return self.predict_many(x.unsqueeze(0), n, alpha, [generator])[0]

    def predict_many(self, images: torch.Tensor, n: int, alpha: float,
                     generators: Sequence[torch.Generator | None]) -> list[int]:
        """:meth:`predict` for a batch of images (B, C, H, W), their noisy samples packed together."""
        validate_sampling(None, n, alpha)
        counts = self.sample_counts_many(images, [n], generators)
        return [prediction_from_counts(c[0], alpha) for c in counts]

    def certify(self, x: torch.Tensor, n0: int, n: int, alpha: float,
                generator: torch.Generator | None = None) -> Certificate:
        """Certify ``x``: a class with an L2 radius that holds with probability >= 1 - alpha, or ABSTAIN."""
        return self.certify_many(x.unsqueeze(0), n0, n, alpha, [generator])[0]

    def certify_many(self, images: torch.Tensor, n0: int, n: int, alpha: float,
                     generators: Sequence[torch.Generator | None]) -> list[Certificate]:
        """:meth:`certify` for a batch of images (B, C, H, W), their noisy samples packed together.

        Per image, n0 selection draws come first, then n fresh estimation draws (counts kept apart).
        """
        validate_sampling(n0, n, alpha)
        counts = self.sample_counts_many(images, [n0, n], generators)
        return [certificate_from_counts(c[0], c[1], alpha, self.sigma) for c in counts]

    def decide(self, x: torch.Tensor, radius: float, n0: int, n_max: int, alpha: float,
               generator: torch.Generator | None = None, method: str | None = None) -> AdaptiveCertificate:
        """Is the smoothed prediction at ``x`` certified at L2 ``radius``? Select a class with n0 samples, then draw
        fresh estimation samples in rounds until an anytime-valid lower bound on pA reaches Phi(radius / sigma)
        (certified), an anytime-valid upper bound falls below it (not certified), or ``n_max`` are spent.
        The answer is wrong with probability at most ``alpha`` (docs/CERTIFY.md, "Adaptive certification");
        "not certified" is a statement about the selected class only."""
        return self.decide_many(x.unsqueeze(0), radius, n0, n_max, alpha, [generator], method)[0]

    def decide_many(self, images: torch.Tensor, radius: float, n0: int, n_max: int, alpha: float,
                    generators: Sequence[torch.Generator | None], method: str | None = None
                    ) -> list[AdaptiveCertificate]:
        """:meth:`decide` for a batch of images (B, C, H, W); the images' rounds share forward passes."""
        rule = sequential_rule("decide", self.sigma, n_max, alpha, radius=radius, method=method)
        return adaptive_many(self, images, n0, rule, generators)

    def certify_adaptive(self, x: torch.Tensor, n0: int, n_max: int, alpha: float,
                         generator: torch.Generator | None = None, tolerance: float | None = None,
                         method: str | None = None) -> AdaptiveCertificate:
        """Cohen's CERTIFY with at most ``n_max`` estimation samples, drawn in rounds: stop once more samples
        cannot raise the certified radius by more than ``tolerance`` (default
        :data:`certify.sequential.DEFAULT_TOLERANCE`). The radius comes from an anytime-valid lower bound on
        pA and holds with probability >= 1 - alpha wherever the procedure stopped."""
        return self.certify_adaptive_many(x.unsqueeze(0), n0, n_max, alpha, [generator], tolerance, method)[0]

    def certify_adaptive_many(self, images: torch.Tensor, n0: int, n_max: int, alpha: float,
                              generators: Sequence[torch.Generator | None], tolerance: float | None = None,
                              method: str | None = None) -> list[AdaptiveCertificate]:
        """:meth:`certify_adaptive` for a batch of images (B, C, H, W)."""
        rule = sequential_rule("estimate", self.sigma, n_max, alpha, tolerance=tolerance, method=method)
        return adaptive_many(self, images, n0, rule, generators)


# ----------------------------------------------------------------------------------------------- adaptive

@dataclass(frozen=True)
class AdaptiveCertificate:
    """Result of :meth:`Smooth.decide` or :meth:`Smooth.certify_adaptive` for one image.

    ``mode``: ``decide`` (certified at ``radius``?) or ``estimate`` (largest radius under the budget).
    ``outcome``: certified / not_certified / budget_spent (decide), estimated (estimate).
    ``n``: estimation samples used (at most ``n_max``); ``samples`` = n0 + n, all noisy samples drawn.
    ``p_lower``: the anytime-valid lower bound on pA at the stop (decide: Phi(R / sigma) when certified).
    A decide answer keeps the class the n0 selection samples chose, certified or not: ``certified`` says which.
    """

    prediction: int  # class index, or ABSTAIN (estimate: pA < 1/2; decide: always the selected class)
    radius: float  # certified L2 radius ([0,1]-pixel units); 0.0 when abstaining or not certified at R
    p_lower: float
    count: int  # estimation samples that voted for the selected class
    n0: int
    n: int
    n_max: int
    mode: str
    outcome: str

    @property
    def abstained(self) -> bool:
        return self.prediction == ABSTAIN

    @property
    def samples(self) -> int:
        return self.n0 + self.n

    @property
    def certified(self) -> bool | None:
        """Decide: True (certified at the radius), False (not certified), None (budget spent, no claim either way);
        estimate: whether a positive radius was certified."""
        if self.mode == "decide":
            return {"certified": True, "not_certified": False}.get(self.outcome)
        return not self.abstained and self.radius > 0


def sequential_rule(mode: str, sigma: float, n_max: int, alpha: float, radius: float | None = None,
                    tolerance: float | None = None, method: str | None = None):
    """The stopping rule of :meth:`Smooth.decide` (``mode="decide"``, needs ``radius``) or
    :meth:`Smooth.certify_adaptive` (``mode="estimate"``): feed it to :class:`certify.sequential.SequentialTest`
    to drive it from counts computed elsewhere."""
    from certify.sequential import DEFAULT_METHOD, DEFAULT_TOLERANCE, DecideRule, EstimateRule, confidence_sequence

    validate_sampling(None, n_max, alpha)
    cs = confidence_sequence(method or DEFAULT_METHOD, n_max, alpha)
    if mode == "decide":
        if radius is None:
            raise UserError("deciding needs the radius to decide at")
        return DecideRule(cs, float(radius), sigma)
    if mode == "estimate":
        return EstimateRule(cs, sigma, DEFAULT_TOLERANCE if tolerance is None else float(tolerance))
    raise UserError(f"mode must be 'decide' or 'estimate', got {mode!r}")


def adaptive_certificate(rule, mode: str, top: int, outcome: int, count: int, n: int, p_lower: float,
                         n0: int, sigma: float) -> AdaptiveCertificate:
    """The certificate of one finished sequential test on the class ``top`` chosen by n0 selection samples."""
    from certify.sequential import CERTIFIED, OUTCOME_NAMES, radius_of

    if mode == "decide":
        certified = outcome == CERTIFIED
        return AdaptiveCertificate(top, float(rule.radius) if certified else 0.0,  # the class, certified or not
                                   p_lower, count, n0, n, rule.cs.n_max, mode, OUTCOME_NAMES[outcome])
    radius = float(radius_of(p_lower, sigma))
    return AdaptiveCertificate(top if p_lower >= 0.5 else ABSTAIN, radius, p_lower, count, n0, n, rule.cs.n_max,
                               mode, OUTCOME_NAMES[outcome])


def adaptive_many(smooth: Smooth, images: torch.Tensor, n0: int, rule,
                  generators: Sequence[torch.Generator | None]) -> list[AdaptiveCertificate]:
    """Select each image's class with n0 samples, then run ``rule`` on fresh estimation samples of that class,
    the active images of each round packed into shared forward passes (:func:`certify.sequential.run_streams`).
    Each image draws from its own generator, selection first: what an image gets depends on its generator
    and its own votes only, never on the other images."""
    from certify.sequential import DecideRule, run_streams

    if n0 < 1:
        raise UserError(f"n0 must be >= 1, got {n0}")
    selection = smooth.sample_counts_many(images, [n0], generators)[:, 0]
    top = selection.argmax(axis=1)

    def draw(active: np.ndarray, samples: int) -> np.ndarray:
        counts = smooth.sample_counts_many(images[torch.as_tensor(active)], [samples],
                                           [generators[i] for i in active])[:, 0]
        return counts[np.arange(len(active)), top[active]]

    mode = "decide" if isinstance(rule, DecideRule) else "estimate"
    results = run_streams(rule, draw, images.shape[0])
    return [adaptive_certificate(rule, mode, int(top[j]), int(results.outcome[j]), int(results.successes[j]),
                                 int(results.samples[j]), float(results.p_lower[j]), n0, smooth.sigma)
            for j in range(images.shape[0])]
