"""SecureSGD (Phan et al., IJCAI 2019): the Heterogeneous Gaussian Mechanism (HGM), a noise layer after the first
layer that gives their robustness bound, and DP-SGD training. Two arms:

- ``securesgd-prt``: a denoiser (the product's autoencoder) with the noise layer after its first convolution,
  trained with DP-SGD on the private split in front of the frozen classifier (loss: eq. (1), ||g(x + N(0, sigma^2))
  - x||^2, as the product's arms). Saved as a DENOISER checkpoint.
- ``securesgd-sct``: a classifier (``cnn28``) with the noise layer after its first convolution, trained from
  scratch with DP-SGD (cross-entropy on x + N(0, sigma^2)) on the private split. Saved as a CLASSIFIER checkpoint.

The mechanisms, as implemented here (docs/BASELINES.md, "SecureSGD", says what differs from the paper and its code):

- Extended Gaussian mechanism (EGM, the paper's bound valid for every epsilon > 0): std >= sqrt(2) Delta
  (sqrt(s) + sqrt(s + epsilon)) / (2 epsilon), s = ln(sqrt(2/pi) / delta) (:func:`egm_noise_multiplier`).
- HGM: noise N(0, sigma_h^2 diag(r)) with a redistribution vector r > 0, sum r = K. Its (epsilon, delta) is computed
  from the r-weighted sensitivity ||diag(r)^(-1/2) (f(D) - f(D'))||_2 <= Delta / sqrt(min r) (Corollary 1 of the
  TransDenoiser paper: a multivariate Gaussian is as private as its smallest-variance direction).
- The noise layer: h = W x + b + N(0, sigma_h^2 diag(r)), the first layer's operator norm per unit of input L2
  norm kept at 1 by a projection after every step (post-processing), so an input change of L2 size L moves h by
  at most L; sigma_h is calibrated by the HGM for (robust_epsilon, robust_delta) at attack size ``attack_bound``.
- Training privacy: DP-SGD (Poisson sampling, every per-example gradient clipped to C over all parameters, noise
  on the sum), accounted by training/privacy/accounting.py (RDP, PLD, GDP): a data-independent guarantee. The noise
  layer is NOT counted towards the training data's privacy (it protects against input changes, not record changes).
- The robustness certificate (:func:`phan_certificate`): Lecuyer et al.'s condition for the noise layer's
  (epsilon, delta), maximised over (epsilon, delta) with the HGM calibration, from Monte-Carlo counts with
  Clopper-Pearson bounds (selection and estimation samples apart).

Modules: the configuration and training here; the mechanisms (EGM, HGM) and the noise-layer models in
:mod:`training.baselines.securesgd_mechanisms`; loading a checkpoint and the certificate in
:mod:`training.baselines.securesgd_certify`.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from training.baselines.common import (
    DPSGDStep,
    dp_sgd_privacy_report,
    example_loss_of,
    format_baseline_privacy_report,
)
from training.baselines.securesgd_mechanisms import (
    ARMS,
    MAX_ROBUST_DELTA,
    NOISE_LAYER_FILE,
    NoiseLayerModel,
    build_noise_layer_model,
    hgm_noise_std,
)
from training.datasets import Dataset
from training.evaluation import FrozenClassifier, check_classifier_fits, classifier_baselines, evaluate, subset
from training.release import noise_description
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent
from transdenoiser.toml import dataclass_from_dict

REPORT_FILE = "privacy_report.txt"
EVAL_BATCH = 500


# ------------------------------------------------------------------------------------------ configuration

@dataclass
class SecureSGDConfig:
    """Everything that decides a SecureSGD run (saved in the checkpoint)."""

    arm: str = "securesgd-prt"
    sigma: float = 0.25  # input noise std (pixels in [0, 1]) during training; the smoothing sigma at certification
    clip_norm: float = 1.0  # C, per-example over all parameters
    noise_multiplier: float = 2.0  # std / C of the gradient noise on the sum (replaced when target_epsilon is set)
    target_epsilon: float | None = None
    calibration_accountant: str = "rdp"
    delta: float = 1e-5
    batch_size: int = 64  # expected batch size B; Poisson rate q = B / N
    epochs: int = 10
    optimizer: str = "sgd"
    learning_rate: float = 0.1
    momentum: float = 0.9
    seed: int = 0
    reproducible_noise: bool = False
    train_examples: int = 0
    eval_examples: int = 0
    eval_noise_seed: int = 12345
    grad_chunk_size: int = 32
    # the noise layer (robustness): (robust_epsilon, robust_delta) of the layer for input changes of L2 size
    # attack_bound; defaults from the authors' MNIST script (dp_epsilon 4.0, attack_norm_bound 0.2, delta 1e-5)
    robust_epsilon: float = 4.0
    robust_delta: float = 1e-5
    attack_bound: float = 0.2
    # r = (1 - mix) * 1 + mix * r_grad, r_grad from the public split (see redistribution_vector); 0: EGM (no HGM)
    redistribution_mix: float = 0.5
    redistribution_steps: int = 100  # non-private steps on the PUBLIC split before r is measured (then re-initialised)
    # sct: parameters left at their (seeded, data-independent) initialisation: cnn28's 3136 x 128 layer holds 401,536
    # of its 467,818 parameters; DP-SGD noise on them would drown the gradient (see docs/BASELINES.md)
    frozen: list[str] = field(default_factory=lambda: ["base.head.1."])
    widths: list[int] = field(default_factory=lambda: [32, 64])  # prt: the autoencoder's widths
    activation: str = "relu"  # prt: the autoencoder's activation

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> SecureSGDConfig:
        return dataclass_from_dict(cls, values, source, kind="SecureSGD ")

    def validate(self, num_examples: int) -> None:
        checks = [
            (self.arm in ARMS, f"arm must be one of {', '.join(ARMS)}, got {self.arm!r}"),
            (self.sigma >= 0 and (self.sigma > 0 or self.arm == "securesgd-sct"),
             f"sigma must be > 0 (>= 0 for securesgd-sct), got {self.sigma}"),
            (self.clip_norm > 0, f"clip norm C must be > 0, got {self.clip_norm}"),
            (self.noise_multiplier > 0 or self.target_epsilon is not None,
             f"the noise multiplier must be > 0, got {self.noise_multiplier}"),
            (self.target_epsilon is None or self.target_epsilon > 0, "target epsilon must be > 0"),
            (self.calibration_accountant in ("rdp", "pld"), "calibration accountant must be rdp or pld"),
            (self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
            (self.batch_size >= 1, f"batch size must be >= 1, got {self.batch_size}"),
            (self.learning_rate > 0, f"learning rate must be > 0, got {self.learning_rate}"),
            (self.momentum >= 0, f"momentum must be >= 0, got {self.momentum}"),
            (self.optimizer in ("sgd", "adam"), f"optimizer must be sgd or adam, got {self.optimizer!r}"),
            (self.robust_epsilon > 0, f"robust epsilon must be > 0, got {self.robust_epsilon}"),
            (0 < self.robust_delta < MAX_ROBUST_DELTA, f"robust delta must lie in (0, {MAX_ROBUST_DELTA})"),
            (self.attack_bound > 0, f"attack bound must be > 0, got {self.attack_bound}"),
            (0 <= self.redistribution_mix < 1, f"redistribution mix must lie in [0, 1), got {self.redistribution_mix}"),
            (self.redistribution_steps >= 0, "redistribution steps must be >= 0"),
            (isinstance(self.grad_chunk_size, int) and self.grad_chunk_size >= 1,
             f"grad_chunk_size must be an integer >= 1 (auto is not available for this arm), got "
             f"{self.grad_chunk_size!r}"),
            (num_examples >= 1, "the private training set is empty"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        q = self.batch_size / num_examples
        if not 0 < q <= 1:
            raise UserError(f"sample rate q = B/N = {self.batch_size}/{num_examples} lies outside (0, 1]: pass "
                            f"--batch-size {num_examples} or less")
        if not 0 < self.delta < 1 / num_examples:
            raise UserError(f"delta must lie in (0, 1/N) = (0, {1 / num_examples:.3g}), got {self.delta}")


def plan(config: SecureSGDConfig, num_examples: int) -> dict[str, Any]:
    """Sample rate, steps and the gradient noise multiplier (calibrated by our accountant for a target epsilon)."""
    from training.privacy.accounting import noise_multiplier_for_epsilon, steps_for_epochs, steps_per_epoch

    q = config.batch_size / num_examples
    total = steps_for_epochs(config.epochs, q)
    z = config.noise_multiplier
    if config.target_epsilon is not None:
        z = noise_multiplier_for_epsilon(config.target_epsilon, q, total, config.delta,
                                         accountant=config.calibration_accountant)
    return {"sample_rate": q, "steps_per_epoch": steps_per_epoch(q), "total_steps": total, "noise_multiplier": z}


# ------------------------------------------------------------------------------------------ redistribution

def _task_loss(kind: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if kind == "classifier":
        return lambda out, y: F.cross_entropy(out, y, reduction="sum")
    return lambda out, x: (out - x).pow(2).sum()


def _task_row_loss(kind: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """:func:`_task_loss` of each row of a batch (ghost clipping's per-row loss)."""
    if kind == "classifier":
        return lambda out, y: F.cross_entropy(out, y, reduction="none")
    return lambda out, x: (out - x).pow(2).flatten(1).sum(1)


def redistribution_vector(model: NoiseLayerModel, x: torch.Tensor, targets: torch.Tensor, sigma: float,
                          mix: float, generator: torch.Generator) -> torch.Tensor:
    """r of the HGM from PUBLIC data: r_grad = |mean over examples of sign(d loss_i / d h_i)| per coordinate of the
    first layer's output, normalised to sum K, then mixed with the uniform vector: r = (1 - mix) + mix r_grad
    (sum K, min r >= 1 - mix > 0)."""
    z = x + sigma * torch.randn(x.shape, generator=generator).to(x.device) if sigma > 0 else x
    h = model.hidden(z).detach().requires_grad_(True)
    if model.kind == "classifier":
        out = model.base.head(model.base.features[1:](h.clone()))
    else:
        out = torch.sigmoid(model.base.decoder(model.base.encoder[1:](h.clone())))
    loss = _task_loss(model.kind)(out, targets)
    (grad,) = torch.autograd.grad(loss, h)
    r_grad = grad.sign().mean(0).abs()
    k = r_grad.numel()
    total = float(r_grad.sum())
    r_grad = r_grad * (k / total) if total > 0 else torch.ones_like(r_grad)
    return ((1 - mix) + mix * r_grad).detach()


# ------------------------------------------------------------------------------------------ training

@torch.no_grad()
def _classifier_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, sigma: float, seed: int,
                         layer_scale: torch.Tensor | None = None) -> float:
    """Accuracy of ``model`` on x (+ N(0, sigma^2) with a fixed seed), optionally with one layer-noise draw."""
    generator = torch.Generator().manual_seed(seed)
    correct = 0
    for start in range(0, len(x), EVAL_BATCH):
        xb = x[start:start + EVAL_BATCH]
        if sigma > 0:
            xb = xb + sigma * torch.randn(xb.shape, generator=generator).to(xb.device)
        if layer_scale is not None:
            noise = torch.randn((len(xb), *layer_scale.shape), generator=generator).to(xb.device) * layer_scale
            logits = model(xb, noise)
        else:
            logits = model(xb)
        correct += int((logits.argmax(1) == y[start:start + EVAL_BATCH]).sum())
    return correct / max(1, len(x))


@torch.no_grad()
def _denoiser_metrics(model: NoiseLayerModel, classifier: nn.Module, x: torch.Tensor, y: torch.Tensor, sigma: float,
                      seed: int, layer_scale: torch.Tensor) -> dict[str, float]:
    plain = evaluate(model.base, classifier, x, y, sigma, seed)  # the registered denoiser: what certify runs
    noisy = _classifier_accuracy(lambda xb, noise=None: classifier(model(xb, noise)), x, y, sigma, seed,
                                 layer_scale)
    return {**plain, "accuracy_denoised_layer_noise": noisy}


def train_securesgd(config: SecureSGDConfig, dataset: Dataset, device: torch.device | str = "cpu",
                    classifier=None, track: Track = silent, *, checkpoint_dir: str | Path | None = None,
                    on_epoch: Callable[[dict], None] | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Train a SecureSGD baseline on ``dataset.private``; return (the registered model, released metadata).

    ``classifier``: a ``training.checkpoint.Checkpoint`` of the frozen classifier (required for
    ``securesgd-prt``; for ``securesgd-sct`` only its input shape and classes are checked). ``checkpoint_dir``:
    written after every epoch (weights, metadata with the privacy report, the noise layer's r,
    privacy_report.txt). The returned model is the registered architecture (``autoencoder`` or ``cnn28``) without
    the noise layer; :func:`load_securesgd` rebuilds the noisy model from a checkpoint."""
    device = torch.device(device)
    train_split = subset(dataset.private, config.train_examples)
    config.validate(len(train_split))
    if config.arm == "securesgd-prt" and classifier is None:
        raise UserError("securesgd-prt trains a denoiser in front of a frozen classifier: pass --classifier")
    if classifier is not None:
        classifier = FrozenClassifier.of(classifier)
        check_classifier_fits(classifier, dataset)
    if len(dataset.test) == 0 or len(dataset.public) == 0:
        raise UserError(f"{dataset.name}: SecureSGD needs non-empty public and test splits")
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if checkpoint_dir is not None and (checkpoint_dir / "metadata.json").exists():
        raise UserError(f"{checkpoint_dir} already holds a checkpoint; choose another --out (nothing is overwritten "
                        "silently; --resume is not available for the SecureSGD arms)")
    num_examples = len(train_split)
    schedule = plan(config, num_examples)
    torch.manual_seed(config.seed)
    public_x, public_y = dataset.public.tensors(device)
    mean = public_x.mean(dim=(0, 2, 3)).tolist()
    std = public_x.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist()
    model, architecture, kwargs = build_noise_layer_model(config.arm, dataset.image_shape, dataset.num_classes, mean,
                                                          std, config.widths, config.activation)
    model = model.to(device)
    model.target_sensitivity = model.sensitivity_per_unit()  # kept at its (seeded, data-free) initial value
    kind = model.kind
    frozen = None
    if kind == "denoiser":
        frozen = classifier.model.to(device).eval()
        for p in frozen.parameters():
            p.requires_grad_(False)
    public_rng = torch.Generator().manual_seed(config.seed)  # public data only: no privacy at stake

    # 1. the redistribution vector r from the public split (the authors measure it after non-private steps on
    #    the training data, then re-initialise; here those steps use the public split, which costs no privacy)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    if config.redistribution_mix > 0:
        warm = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_of = _task_loss(kind)
        for _ in range(config.redistribution_steps):
            idx = torch.randint(0, len(public_x), (config.batch_size,), generator=public_rng).to(device)
            xb = public_x[idx]
            z = xb + config.sigma * torch.randn(xb.shape, generator=public_rng).to(device) if config.sigma > 0 else xb
            loss = loss_of(model(z), public_y[idx] if kind == "classifier" else xb) / len(xb)
            warm.zero_grad(set_to_none=True)
            loss.backward()
            warm.step()
            model.project()
        idx = torch.randperm(len(public_x), generator=public_rng)[:10 * config.batch_size].to(device)
        r = redistribution_vector(model, public_x[idx], public_y[idx] if kind == "classifier" else public_x[idx],
                                  config.sigma, config.redistribution_mix, public_rng)
        model.load_state_dict(initial)
    else:
        r = torch.ones(model.hidden_shape(dataset.image_shape), device=device)
    model.project()
    noise_std = hgm_noise_std(config.robust_epsilon, config.robust_delta,
                              config.attack_bound * model.target_sensitivity, r)
    layer_scale = (noise_std * r.sqrt()).to(device)

    # 2. DP-SGD on the private split
    if config.reproducible_noise:
        generator = torch.Generator().manual_seed(config.seed)
    else:
        generator = torch.Generator().manual_seed(secrets.randbits(63))
    x_train, y_train = train_split.tensors(device)
    test = subset(dataset.test, config.eval_examples)
    x_test, y_test = test.tensors(device)
    model.eval()  # no dropout: a per-example gradient must not depend on other randomness than the drawn noise
    for name, p in model.named_parameters():
        p.requires_grad_(kind == "denoiser" or not any(name.startswith(prefix) for prefix in config.frozen))
    example_loss = example_loss_of(model, _task_loss(kind))
    step = DPSGDStep(model, example_loss, config.clip_norm, schedule["noise_multiplier"], float(config.batch_size),
                     config.grad_chunk_size, row_loss=_task_row_loss(kind))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = (torch.optim.SGD(params, lr=config.learning_rate, momentum=config.momentum)
                 if config.optimizer == "sgd" else torch.optim.Adam(params, lr=config.learning_rate))
    from training.privacy.dp import PoissonSampler

    sampler = PoissonSampler(num_examples, schedule["sample_rate"])
    baselines = None
    if frozen is not None:
        baselines = classifier_baselines(frozen, x_test, y_test, config.sigma, config.eval_noise_seed)
    metrics: list[dict[str, Any]] = []
    steps_done = 0
    for epoch in range(config.epochs):
        started = time.perf_counter()
        losses = []
        for _ in track(range(schedule["steps_per_epoch"]), desc=f"{config.arm} epoch {epoch + 1}/{config.epochs}",
                       total=schedule["steps_per_epoch"]):
            if steps_done >= schedule["total_steps"]:
                break
            index = sampler.sample(generator).to(device)
            xb = x_train[index]
            z = xb + config.sigma * torch.randn(xb.shape, generator=generator).to(device) if config.sigma > 0 else xb
            noise = torch.randn((len(xb), *layer_scale.shape), generator=generator).to(device) * layer_scale
            target = y_train[index] if kind == "classifier" else xb
            grads, mean_loss = step.gradient((z, noise, target), generator)
            for name, p in model.named_parameters():
                if name in grads:
                    p.grad = grads[name].detach()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            model.project()  # post-processing of the privatised update: keeps the layer's sensitivity at 1
            steps_done += 1
            if not math.isnan(mean_loss):
                losses.append(mean_loss)
        if kind == "classifier":
            row = {"epoch": epoch + 1,
                   "accuracy_clean": _classifier_accuracy(model.base, x_test, y_test, 0.0, config.eval_noise_seed),
                   "accuracy_noisy": _classifier_accuracy(model.base, x_test, y_test, config.sigma,
                                                          config.eval_noise_seed),
                   "accuracy_clean_layer_noise": _classifier_accuracy(model, x_test, y_test, 0.0,
                                                                      config.eval_noise_seed, layer_scale)}
        else:
            row = {"epoch": epoch + 1, **_denoiser_metrics(model, frozen, x_test, y_test, config.sigma,
                                                           config.eval_noise_seed, layer_scale)}
        metrics.append(row)
        meta = _metadata(config, dataset, classifier, architecture, kwargs, schedule, steps_done, metrics, baselines,
                         noise_std, r, model, num_examples, device)
        if checkpoint_dir is not None:
            _save(checkpoint_dir, model, meta, r)
        if on_epoch is not None:
            on_epoch({**row, "train_loss": float(np.mean(losses)) if losses else math.nan,
                      "seconds": time.perf_counter() - started})
    model.eval()
    return model.base, meta


def _privacy(config, schedule, steps_done, num_examples, noise_std, r, model) -> dict[str, Any]:
    from training.privacy.accounting import gaussian_mechanism_delta

    sensitivity = model.sensitivity_per_unit() * config.attack_bound
    r_min = float(r.min())
    std_over_sensitivity = noise_std * math.sqrt(r_min) / sensitivity
    noise_layer = {
        "label": ("robustness budget of the noise layer (NOT a privacy guarantee for the training data: it bounds how "
                  "much an input change of L2 size attack_bound can move the layer's output distribution)"),
        "layer": model.first_layer_name, "noise_std": noise_std, "redistribution_min": r_min,
        "redistribution_max": float(r.max()), "redistribution_mix": config.redistribution_mix,
        "attack_bound": config.attack_bound, "sensitivity_per_unit_input": model.sensitivity_per_unit(),
        "robust_epsilon": config.robust_epsilon,
        "robust_delta_paper_analysis": config.robust_delta,
        "robust_delta_exact_gaussian": gaussian_mechanism_delta(config.robust_epsilon, std_over_sensitivity),
        "analyses": {"robust_delta_paper_analysis": "the paper's analysis: EGM/HGM bound, sigma_h = sqrt(2) "
                                                    "(sqrt(s)+sqrt(s+eps)) L / (2 eps sqrt(min r))",
                     "robust_delta_exact_gaussian": "exact delta of the Gaussian mechanism at that std over the "
                                                    "r-weighted sensitivity (Balle & Wang 2018), data-independent"}}
    claim = ("a data-independent (epsilon, delta)-DP guarantee for the released model: DP-SGD on the private split; "
             "the public split (normalisation, redistribution vector r) costs no privacy")
    return dp_sgd_privacy_report(
        arm=config.arm, sigma=config.sigma, clip_norm=config.clip_norm, noise_multiplier=schedule["noise_multiplier"],
        sample_rate=schedule["sample_rate"], num_examples=num_examples, expected_batch_size=float(config.batch_size),
        delta=config.delta, steps_planned=schedule["total_steps"], steps_done=steps_done,
        noise=noise_description(config),  # same wording as the product's arms (reads mode and seed only)
        target_epsilon=config.target_epsilon,
        calibration_accountant=config.calibration_accountant if config.target_epsilon is not None else None,
        claim=claim, extra={"noise_layer": noise_layer})


def _metadata(config, dataset, classifier, architecture, kwargs, schedule, steps_done, metrics, baselines, noise_std,
              r, model, num_examples, device) -> dict[str, Any]:
    from transdenoiser.runtime import hardware_description

    securesgd = {"paper": "Phan et al., IJCAI 2019 (SecureSGD, HGM)", "layer": model.first_layer_name,
                 "noise_std": noise_std, "hidden_shape": list(r.shape), "file": f"{NOISE_LAYER_FILE}.safetensors",
                 "robust_epsilon": config.robust_epsilon, "robust_delta": config.robust_delta,
                 "attack_bound": config.attack_bound, "redistribution_min": float(r.min()),
                 "sensitivity_per_unit_input": model.sensitivity_per_unit(),
                 "frozen_at_initialisation": [n for n, p in model.named_parameters() if not p.requires_grad],
                 "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad)}
    meta: dict[str, Any] = {
        "architecture": architecture, "arch_kwargs": kwargs, "input_shape": list(dataset.image_shape),
        "dataset": {"name": dataset.name, "split_seed": dataset.split_seed, "trained_on": "private",
                    "train_examples": num_examples, "fingerprints": dataset.released_fingerprints(),
                    "source": dataset.source},
        "sigma": config.sigma, "arm": config.arm, "config": asdict(config), "schedule": schedule,
        "epochs_done": len(metrics), "steps_done": steps_done, "complete": steps_done == schedule["total_steps"],
        "metrics": metrics, "securesgd": securesgd,
        "privacy": _privacy(config, schedule, steps_done, num_examples, noise_std, r, model),
        "device": str(device), "hardware": hardware_description(torch.device(device)),
    }
    if model.kind == "classifier":
        meta.update({"kind": "classifier", "num_classes": dataset.num_classes, "class_names": list(dataset.classes),
                     "normalization": {"mean": kwargs["mean"], "std": kwargs["std"],
                                       "note": "from the public split; applied inside the model"},
                     "test_accuracy": metrics[-1]["accuracy_clean"] if metrics else None})
    else:
        meta.update({"kind": "denoiser", "classifier": classifier.summary(), "baselines": baselines})
    return meta


def _save(directory: Path, model: NoiseLayerModel, metadata: dict[str, Any], r: torch.Tensor) -> None:
    from training.checkpoint import replace_directory, save_checkpoint, write_text

    def write(staging: Path) -> None:
        save_checkpoint(staging, model.base, metadata, extra_tensors={NOISE_LAYER_FILE: {"redistribution": r}})
        write_text(staging / REPORT_FILE, format_baseline_privacy_report(metadata["privacy"]) + "\n")

    replace_directory(directory, write)


def format_training_summary(meta: dict[str, Any]) -> str:
    """What ``transdenoiser train`` prints after a SecureSGD run."""
    last = meta["metrics"][-1]
    if meta["kind"] == "classifier":
        head = (f"securesgd-sct classifier cnn28 trained from scratch, {meta['epochs_done']} epochs: test accuracy "
                f"clean {last['accuracy_clean']:.4f}, on x + N(0, {meta['sigma']}^2) {last['accuracy_noisy']:.4f}, "
                f"clean with the noise layer {last['accuracy_clean_layer_noise']:.4f}")
    else:
        head = (f"securesgd-prt denoiser, {meta['epochs_done']} epochs: classifier accuracy on g(x + N(0, "
                f"{meta['sigma']}^2)) {last['accuracy_denoised']:.4f} (with the noise layer "
                f"{last['accuracy_denoised_layer_noise']:.4f}); without denoiser "
                f"{meta['baselines']['accuracy_noisy_no_denoiser']:.4f}; MSE {last['mse']:.5f}")
    return head + "\n" + format_baseline_privacy_report(meta["privacy"])


__all__ = ["ARMS", "REPORT_FILE", "SecureSGDConfig", "plan", "redistribution_vector", "train_securesgd",
           "format_training_summary"]
