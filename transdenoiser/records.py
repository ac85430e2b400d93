"""Typed records: the JSON files one package writes and another reads, as frozen dataclasses.

- :class:`DatasetRef`: a checkpoint's ``dataset`` (name, source, split seed, split fingerprints).
- :class:`CheckpointMetadata`: a checkpoint's ``metadata.json`` (``training/checkpoint.py``); a denoiser's
  :class:`VersusClassifier` (its accuracy under noise against the classifier alone's, as training measured them).
- :class:`PrivacyReport` (with :class:`Guarantee` and :class:`Epsilon`): the released privacy report, a
  checkpoint's ``privacy`` (``training/privacy/report.py``, the baselines' reports, the convex heads').
- :class:`CertificationSummary` (with :class:`RadiusRow`): a certify or predict run's ``summary.json``
  (``certify/summary.py``, ``certify/report.py``).
- :class:`BaselineCertificationSummary` (with :class:`BaselineCertificate`): a ``baseline-certify`` run's
  ``summary.json`` (``certify/baseline_job.py``, ``certify/baseline_report.py``).

Each has a ``FORMAT_VERSION``, ``to_json()`` (a plain dict) and ``from_json(dict)``, which refuses a bad record
with a one-line error naming the problem (a missing field, a wrong type, an unsupported format version) and
keeps every key it has no field for in ``extra``, so nothing is lost. ``from_json(d).to_json() == d`` with the
keys in the same order, so a record read and written again gives the same bytes. Version 1 is the format
today's code writes; files without a ``format_version`` key are version 1. Nested tables and lists are frozen
(read-only mappings, tuples) and become dicts and lists again in ``to_json()``.

Ground floor: imports nothing of ours but :mod:`transdenoiser.errors`.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

from transdenoiser.errors import CheckpointError, UserError

SUPPORTED_VERSIONS = (1,)
WEIGHTS_FILE = "weights.safetensors"


def freeze(value: Any) -> Any:
    """A JSON value made read-only: mappings become read-only mappings, lists tuples (recursively)."""
    if isinstance(value, Mapping):
        return MappingProxyType({key: freeze(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(item) for item in value)
    return value


def thaw(value: Any) -> Any:
    """The plain JSON value of a frozen one (records become their ``to_json()``)."""
    if isinstance(value, _Record):
        return value.to_json()
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(item) for item in value]
    return value


# What a field holds: a kind name, a record class, or ("list", kind or record class).
_CHECKS = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "number": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    # an epsilon: a number, or "inf" / "-inf" as json_safe writes infinities
    "epsilon": (lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool)) or v in ("inf", "-inf"),
                "a number or \"inf\""),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "mapping": (lambda v: isinstance(v, Mapping), "a table"),
    "any": (lambda v: True, "anything"),
}


class _Record:
    """Shared JSON reading and writing of the records below (dataclasses with a ``SPEC``)."""

    FORMAT_VERSION: ClassVar[int] = 1
    NAME: ClassVar[str] = "record"
    ERROR: ClassVar[type[UserError]] = UserError
    # JSON key -> (kind, required). Each key is also the dataclass field's name.
    SPEC: ClassVar[dict[str, Any]] = {}

    def to_json(self) -> dict[str, Any]:
        """The record as the plain dict it was read from (same keys, same order) or would be written as."""
        extra = self.extra  # type: ignore[attr-defined]
        order = list(self.key_order)  # type: ignore[attr-defined]
        present = set(order)
        order += [key for key in self.SPEC if key not in present and getattr(self, key) is not None]
        order += [key for key in extra if key not in present and key not in self.SPEC]
        return {key: thaw(getattr(self, key) if key in self.SPEC else extra[key]) for key in order}

    @property
    def version(self) -> int:
        """The record's format version (1 when the file names none)."""
        value = getattr(self, "format_version", None)
        return self.FORMAT_VERSION if value is None else value

    @classmethod
    def from_json(cls, data: Any, where: str | None = None):
        """The record of ``data`` (a dict read from JSON); ``where`` (a file name) starts any error message."""
        prefix = f"{where}: " if where else ""
        if isinstance(data, cls):
            return data
        if not isinstance(data, Mapping):
            raise cls.ERROR(f"{prefix}{cls.NAME} must be a JSON object, got {type(data).__name__}")
        version = data.get("format_version", 1)
        if "format_version" in cls.SPEC and version not in SUPPORTED_VERSIONS:
            raise cls.ERROR(f"{prefix}{cls.NAME} format version {version!r} is not supported (this version reads "
                            f"{', '.join(map(str, SUPPORTED_VERSIONS))})")
        values = {key: cls._read(key, kind, required, data, prefix) for key, (kind, required) in cls.SPEC.items()}
        extra = {key: freeze(value) for key, value in data.items() if key not in cls.SPEC}
        return cls(**values, extra=MappingProxyType(extra), key_order=tuple(data))  # type: ignore[call-arg]

    @classmethod
    def _read(cls, key: str, kind: Any, required: bool, data: Mapping[str, Any], prefix: str) -> Any:
        if key not in data or data[key] is None:
            if required:
                raise cls.ERROR(f"{prefix}{cls.NAME} has no {key!r}" + (" (null)" if key in data else ""))
            return None
        return cls._convert(data[key], kind, f"{prefix}{cls.NAME}'s {key!r}")

    @classmethod
    def _convert(cls, value: Any, kind: Any, what: str) -> Any:
        if isinstance(kind, tuple):  # ("list", item kind)
            if not isinstance(value, (list, tuple)):
                raise cls.ERROR(f"{what} must be a list, got {type(value).__name__}")
            return tuple(cls._convert(item, kind[1], f"{what}[{i}]") for i, item in enumerate(value))
        if isinstance(kind, type) and issubclass(kind, _Record):
            try:
                return kind.from_json(value)
            except UserError as exc:
                raise cls.ERROR(f"{what}: {exc}") from None
        check, text = _CHECKS[kind]
        if not check(value):
            raise cls.ERROR(f"{what} must be {text}, got {value!r}"[:300])
        return freeze(value)


def _record(cls):
    """Make ``cls`` a frozen dataclass with one optional field per ``SPEC`` key, then ``extra`` and ``key_order``."""
    cls.__annotations__ = {key: "Any" for key in cls.SPEC}
    for key in cls.SPEC:
        setattr(cls, key, None)
    cls.__annotations__["extra"] = "Mapping[str, Any]"
    cls.extra = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    cls.__annotations__["key_order"] = "tuple[str, ...]"
    cls.key_order = dataclasses.field(default=(), compare=False, repr=False)
    return dataclasses.dataclass(frozen=True)(cls)


def as_float(value: Any) -> float | None:
    """A recorded number as a float: ``"inf"`` -> inf; None for anything that is not a number."""
    if value in ("inf", "-inf"):
        return math.inf if value == "inf" else -math.inf
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


# ----------------------------------------------------------------------------------------------- datasets

@_record
class DatasetRef(_Record):
    """The dataset a checkpoint was trained (or, imported, measured) on: ``metadata.json``'s ``dataset``.

    ``trained_on``: the split (``public``, ``private``) or a note; ``fingerprints``: split name -> SHA-256 of
    its pixels and labels (never the private split's in a release).
    """

    NAME = "dataset reference"
    SPEC = {"name": ("str", True), "source": ("str", False), "split_seed": ("int", False),
            "trained_on": ("str", False), "train_examples": ("int", False), "fingerprints": ("mapping", False),
            "features_from": ("any", False)}

    def fingerprint(self, split: str | None) -> str | None:
        """The recorded fingerprint of ``split``, or None."""
        return (self.fingerprints or {}).get(split) if split else None


# ----------------------------------------------------------------------------------------------- privacy

@_record
class Epsilon(_Record):
    """One guarantee's epsilon at ``delta`` by each accountant (``training.privacy.accounting.epsilon_report``);
    ``analyses`` names the analysis behind each. Values are numbers or ``"inf"``; :meth:`value` reads them."""

    NAME = "epsilon"
    SPEC = {"rdp": ("epsilon", False), "pld": ("epsilon", False), "gdp_mu": ("epsilon", False),
            "gdp_epsilon": ("epsilon", False), "delta": ("number", False), "analyses": ("mapping", False)}

    def value(self, accountant: str) -> float | None:
        """``rdp``, ``pld``, ``gdp_mu`` or ``gdp_epsilon`` as a float (inf for "inf"); None when not computed."""
        return as_float(getattr(self, accountant))


@_record
class Guarantee(_Record):
    """One entry of a privacy report's ``guarantees``: its name, label, whether it is data-independent, epsilon."""

    NAME = "guarantee"
    SPEC = {"name": ("str", True), "label": ("str", False), "data_independent": ("bool", False),
            "noise_multiplier": ("number", False), "epsilon": (Epsilon, False)}


@_record
class PrivacyReport(_Record):
    """The released privacy report a denoiser (or a private classifier) carries as ``metadata.json``'s
    ``privacy``: a typed view of the dict ``training.privacy.report.released_privacy_report`` (and the
    baselines' and convex heads' report builders) write. The full report's further keys stay in ``extra``;
    ``to_json()`` gives back the stored dict exactly, key order included.
    """

    NAME = "privacy report"
    SPEC = {"arm": ("str", False), "sigma": ("number", False), "clip_norm": ("number", False),
            "xi_low": ("number", False), "xi_up": ("number", False), "merge_uncredited_noise": ("bool", False),
            "sample_rate": ("number", False), "num_examples": ("int", False),
            "expected_batch_size": ("number", False), "delta": ("number", False), "steps_planned": ("int", False),
            "steps_done": ("int", False), "complete": ("bool", False), "units": ("str", False),
            "target_epsilon": ("number", False), "calibration_accountant": ("str", False),
            "noise": ("mapping", False), "initialisation": ("mapping", False), "privacy_claim": ("str", False),
            "guarantees": (("list", Guarantee), False), "not_released": (("list", "str"), False)}

    @property
    def noise_mode(self) -> str:
        """How the DP noise was drawn: ``secret``, ``reproducible`` or ``unknown``."""
        return str((self.noise or {}).get("mode", "unknown"))

    def data_independent(self) -> list[Guarantee]:
        """The guarantees that are data-independent and give an epsilon (not the "none established" entry)."""
        return [g for g in self.guarantees or () if g.data_independent and g.name != "data_independent"]

    def named(self, name: str) -> Guarantee | None:
        """The guarantee called ``name`` (``sepdp``, ``mmga``, ``dp_sgd``, ...), or None."""
        return next((g for g in self.guarantees or () if g.name == name), None)


# ----------------------------------------------------------------------------------------------- checkpoints

CHECKPOINT_FORMAT = "transdenoiser-checkpoint"


def trained_sigma(sigma: Any, config: Any) -> float | None:
    """The input-noise sigma a checkpoint's metadata records: its ``sigma``, else (missing or null) its
    ``config``'s; None unless that is a finite number."""
    value = sigma if sigma is not None else (config if isinstance(config, Mapping) else {}).get("sigma")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def recorded_arm(metadata: Mapping[str, Any] | None) -> str | None:
    """The training arm a checkpoint's metadata records, wherever its writer put it; None if it says none.

    The denoiser trainers (nodp, sepdp, transdenoiser, the recipe) and every private trainer's report write it
    in the privacy report (``privacy.arm``); the baselines (securesgd-prt/-sct, stobatch) also at the top level
    (``arm``); older checkpoints may have it in their ``train`` section. Tolerant of partial metadata (a run's
    summary may carry only part of it).
    """
    if not isinstance(metadata, Mapping):
        return None
    for source in (metadata.get("privacy"), metadata, metadata.get("train")):
        if isinstance(source, Mapping) and source.get("arm"):
            return str(source["arm"])
    return None


def recorded_objective(metadata: Mapping[str, Any] | None) -> str | None:
    """The training objective a denoiser's metadata records (``objective``, else its ``config``'s); ``mse`` for a
    denoiser written before objectives were recorded (all of those trained with MSE); None for anything else that
    records none. Tolerant of partial metadata, as :func:`recorded_arm`."""
    if not isinstance(metadata, Mapping):
        return None
    config = metadata.get("config")
    value = metadata.get("objective") or (config.get("objective") if isinstance(config, Mapping) else None)
    if value is None and metadata.get("kind") == "denoiser":
        return "mse"
    return str(value) if value is not None else None


@_record
class CheckpointMetadata(_Record):
    """A checkpoint's ``metadata.json``: what the weights are (kind, architecture and its arguments, input shape,
    classes), what they were trained on (``dataset``), what they guarantee (``privacy``), the hashes of the
    checkpoint's files and the versions that wrote them. Every further key a trainer records (config, schedule,
    metrics, hardware, a baseline's section, ...) stays in ``extra``.
    """

    NAME = "checkpoint metadata"
    ERROR = CheckpointError
    SPEC = {"format": ("str", False), "format_version": ("int", False), "kind": ("str", True),
            "architecture": ("str", True), "arch_kwargs": ("mapping", False), "files": ("mapping", False),
            "input_shape": (("list", "int"), False), "num_classes": ("int", False),
            "class_names": (("list", "str"), False), "normalization": ("mapping", False),
            "dataset": (DatasetRef, False), "classifier": ("mapping", False), "sigma": ("number", False),
            "test_accuracy": ("number", False), "privacy": (PrivacyReport, False), "num_parameters": ("int", False),
            "package_version": ("str", False), "torch_version": ("str", False), "objective": ("str", False)}

    @classmethod
    def from_json(cls, data: Any, where: str | None = None) -> CheckpointMetadata:
        record = super().from_json(data, where)
        if record.format is not None and record.format != CHECKPOINT_FORMAT:
            raise CheckpointError(f"{where + ': ' if where else ''}{cls.NAME} is not a {CHECKPOINT_FORMAT} file "
                                  f"(format {record.format!r})")
        for name, value in (record.files or {}).items():
            if not isinstance(value, str):
                raise CheckpointError(f"{where + ': ' if where else ''}{cls.NAME}'s 'files' gives no valid SHA-256 for "
                                      f"{name} (got {value!r})")
        return record

    @property
    def arm(self) -> str | None:
        """The training arm (see :func:`recorded_arm`)."""
        return recorded_arm({"privacy": {"arm": self.privacy.arm} if self.privacy else None,
                             "arm": self.extra.get("arm"), "train": self.extra.get("train")})

    @property
    def weights_sha256(self) -> str | None:
        """The recorded SHA-256 of ``weights.safetensors``."""
        return (self.files or {}).get(WEIGHTS_FILE)

    @property
    def trained_sigma(self) -> float | None:
        """The input-noise sigma a denoiser was trained at (``sigma``, else its ``config``'s), None if unknown."""
        return trained_sigma(self.sigma, self.extra.get("config"))

    @property
    def training_objective(self) -> str | None:
        """A denoiser's training objective (``mse``, ``stability``, ``classification``, ``stability+mse``): its
        ``objective``, else its ``config``'s; ``mse`` for a denoiser written before objectives were recorded
        (all of those trained with MSE); None for any other kind of checkpoint that records none."""
        return recorded_objective({"objective": self.objective, "config": self.extra.get("config"),
                                   "kind": self.kind})

    @property
    def classifier_classes(self) -> int | None:
        """A denoiser's record of the number of classes of the classifier it was trained for."""
        return (self.classifier or {}).get("num_classes")

    @property
    def versus_classifier(self) -> VersusClassifier | None:
        """What the denoiser adds to the classifier under noise, as training measured it (see
        :class:`VersusClassifier`); None without both recorded figures."""
        return VersusClassifier.of(self)


WORSE_Z = 1.6448536269514722  # one-sided test at level 5%: Phi^-1(0.95)


@dataclasses.dataclass(frozen=True)
class VersusClassifier:
    """The frozen classifier's accuracy on test images + N(0, sigma^2) with the denoiser in front of it and without,
    as training recorded them at its last epoch (``metrics[-1].accuracy_denoised`` and ``baselines``): the same
    ``images`` test images, the same noise draw. ``worse`` is the rule that makes ``train``, ``certify`` and
    ``bundle`` say so (and ``bundle`` refuse): the denoiser's accuracy lower by more than WORSE_Z standard errors
    of the difference of two proportions over ``images`` (a one-sided z-test at 5%, the two figures taken as
    independent: paired on the same images they are usually positively correlated, which makes this test flag
    fewer cases than a paired one); where the count of images is not recorded (older checkpoints), any lower
    figure. The other fields are what the warning cites as the likely causes."""

    with_denoiser: float
    without_denoiser: float
    clean: float | None = None
    images: int | None = None
    sigma: float | None = None
    private_examples: int | None = None
    steps: int | None = None
    epsilon: float | None = None  # the first data-independent guarantee's RDP epsilon, else the target epsilon
    arm: str | None = None

    @classmethod
    def of(cls, record: CheckpointMetadata) -> VersusClassifier | None:
        """The figures of a denoiser checkpoint's metadata; None unless both accuracies are recorded."""
        metrics, baselines = record.extra.get("metrics"), record.extra.get("baselines")
        last = metrics[-1] if isinstance(metrics, (list, tuple)) and metrics else None
        with_denoiser = as_float(last.get("accuracy_denoised")) if isinstance(last, Mapping) else None
        without = as_float(baselines.get("accuracy_noisy_no_denoiser")) if isinstance(baselines, Mapping) else None
        if with_denoiser is None or without is None:
            return None
        images = baselines.get("images")
        privacy = record.privacy
        guarantees = privacy.data_independent() if privacy else []
        epsilon = guarantees[0].epsilon.value("rdp") if guarantees and guarantees[0].epsilon else None
        steps = record.extra.get("steps_done", privacy.steps_done if privacy else None)
        return cls(with_denoiser, without, as_float(baselines.get("accuracy_clean")),
                   images if isinstance(images, int) and images > 0 else None, record.trained_sigma,
                   record.dataset.train_examples if record.dataset else None,
                   steps if isinstance(steps, int) else None,
                   epsilon if epsilon is not None else (privacy.target_epsilon if privacy else None), record.arm)

    @property
    def margin(self) -> float:
        """How much lower the denoiser's accuracy must be to count as worse: WORSE_Z standard errors (0 when the
        number of images is unknown)."""
        if self.images is None:
            return 0.0
        variance = sum(p * (1 - p) for p in (self.with_denoiser, self.without_denoiser)) / self.images
        return WORSE_Z * math.sqrt(variance)

    @property
    def worse(self) -> bool:
        """Whether the denoiser makes the classifier less accurate under noise than no denoiser (the rule above)."""
        return self.without_denoiser - self.with_denoiser > max(self.margin, 1e-12)

    @property
    def images_lost(self) -> int | None:
        """How many more of the ``images`` test images the classifier gets wrong with the denoiser than without."""
        return None if self.images is None else round((self.without_denoiser - self.with_denoiser) * self.images)


# ----------------------------------------------------------------------------------------------- certification

@_record
class RadiusRow(_Record):
    """One row of a summary's ``certified_accuracy`` table: the share certified correct at this L2 radius."""

    NAME = "certified-accuracy row"
    SPEC = {"radius": ("number", True), "certified_accuracy": ("number", False)}


@_record
class CertificationSummary(_Record):
    """A run's ``summary.json`` (``task`` certify or predict): its settings, the numbers, the models' metadata.

    ``settings`` is the run's settings.json; ``classifier_metadata``/``denoiser_metadata`` the checkpoints'
    metadata as the run recorded them (read them with :meth:`denoiser`). Adaptive runs add ``mode``,
    ``radius``, ``tolerance``, ``sequential`` and the samples per image; decide runs a ``decide`` table.
    """

    NAME = "run summary"
    SPEC = {"format_version": ("int", False), "task": ("str", True), "images": ("int", True),
            "smoothed_clean_accuracy": ("number", False), "smoothed_accuracy": ("number", False),
            "abstention_rate": ("number", False), "wrong_rate": ("number", False),
            "certified_accuracy": (("list", RadiusRow), False), "average_certified_radius": ("number", False),
            "largest_certified_radius": ("number", False), "max_certifiable_radius": ("number", False),
            "sigma": ("number", True), "n0": ("int", False), "n": ("int", True), "alpha": ("number", True),
            "guarantee": ("str", False), "seconds_per_image": ("number", False),
            "noisy_samples_per_second": ("number", False), "mode": ("str", False), "radius": ("number", False),
            "tolerance": ("number", False), "sequential": ("mapping", False), "samples_per_image": ("mapping", False),
            "decide": ("mapping", False), "hardware": (("list", "str"), False), "timing": ("mapping", False),
            "settings": ("mapping", False), "classifier_metadata": ("mapping", False),
            "denoiser_metadata": ("mapping", False)}

    @property
    def precision(self) -> str:
        """The precision the base classifier ran at (``float32`` when the settings predate the choice)."""
        return str((self.settings or {}).get("precision", "float32"))

    @property
    def arm(self) -> str | None:
        """The denoiser's training arm (see :func:`recorded_arm`); None without a denoiser or a recorded arm."""
        return recorded_arm(thaw(self.denoiser_metadata))

    def setting(self, key: str) -> Any:
        """A run setting, falling back to the summary's own key of that name (``sigma``, ``n``, ``mode``...)."""
        settings = self.settings or {}
        if key in settings:
            return settings[key]
        return getattr(self, key) if key in self.SPEC else self.extra.get(key)

    def denoiser(self) -> CheckpointMetadata | None:
        """The denoiser's checkpoint metadata as recorded by the run, None for a run without a denoiser."""
        return None if self.denoiser_metadata is None else CheckpointMetadata.from_json(self.denoiser_metadata)

    def privacy(self) -> PrivacyReport | None:
        """The denoiser's privacy report, None without a denoiser or a report."""
        privacy = (self.denoiser_metadata or {}).get("privacy")
        return PrivacyReport.from_json(privacy) if isinstance(privacy, Mapping) else None


# ----------------------------------------------------------------------------------------------- baselines

BASELINE_TASK = "baseline-certify"


@_record
class BaselineCertificate(_Record):
    """One certificate's part of a ``baseline-certify`` summary (``phan``: the baseline's own certificate;
    ``smoothing``: randomized smoothing of the same randomised model): certified accuracy by L2 radius (the radius
    as text, ``"0.05"``), the share of abstentions, the median certified radius and what the certificate is."""

    NAME = "baseline certificate"
    SPEC = {"certified_accuracy": ("mapping", True), "accuracy": ("number", False),
            "abstain_rate": ("number", False), "median_radius": ("number", False), "note": ("str", False)}

    def table(self) -> list[tuple[float, float]]:
        """(L2 radius, certified accuracy) pairs, smallest radius first."""
        return sorted((float(radius), float(value)) for radius, value in self.certified_accuracy.items())


@_record
class BaselineCertificationSummary(_Record):
    """A ``baseline-certify`` run's ``summary.json``: the checkpoint and its arm, the images and sampling, and two
    certificates of the same randomised model (:class:`BaselineCertificate`): ``phan``, the baseline's own, and
    ``smoothing``, randomized smoothing at ``smoothing_sigma``. Radii are L2, pixels in [0, 1]. ``noise_layer``
    and ``privacy`` are the baseline's records; ``seconds`` sums the images' certificate times. Files without
    ``format_version``/``task`` (written before they were added) are version 1 of this record.
    """

    NAME = "baseline-certify summary"
    SPEC = {"format_version": ("int", False), "task": ("str", False), "model": ("str", True), "arm": ("str", True),
            "dataset": ("str", True), "split": ("str", False), "num_images": ("int", True),
            "indices": (("list", "int"), False), "n0": ("int", True), "n": ("int", True), "alpha": ("number", True),
            "seed": ("int", False), "smoothing_sigma": ("number", True), "radius_units": ("str", False),
            "phan": (BaselineCertificate, True), "smoothing": (BaselineCertificate, True),
            "noise_layer": ("mapping", False), "privacy": ("mapping", False), "seconds": ("number", False),
            "images_resumed": ("int", False), "seconds_note": ("str", False), "hardware": ("str", False)}

    @classmethod
    def from_json(cls, data: Any, where: str | None = None) -> BaselineCertificationSummary:
        record = super().from_json(data, where)
        if record.task not in (None, BASELINE_TASK):
            raise UserError(f"{where + ': ' if where else ''}{cls.NAME} is for task {record.task!r}, not "
                            f"{BASELINE_TASK}")
        return record


def is_baseline_summary(data: Any) -> bool:
    """Whether a ``summary.json``'s content is a ``baseline-certify`` summary (its task, or, in files that predate
    the task key, its two certificates ``phan`` and ``smoothing``)."""
    if not isinstance(data, Mapping):
        return False
    return data.get("task") == BASELINE_TASK or ("task" not in data and "phan" in data and "smoothing" in data)
