"""The ledger of certification tests: which test each certify run spent on which images of which noise stream.

Image ``idx`` of a certify run draws its noise from (``--seed``, idx), so two runs on one seed read the same votes.
Whether their answers may be combined depends on the test each one runs (docs/CERTIFY.md, "What may be
combined"): all adaptive runs with the default sequential test read one family of tests, the ladder
(:mod:`certify.ladder`), so any number of them (any radius, budget or tolerance) are **one** test at level alpha;
Cohen's fixed-n runs at different n, and the other sequential methods, are different tests of the same votes, and
k of them hold together only at k * alpha. A run directory (:mod:`certify.rundir`) sees only its own runs; the
ledger sees them all, across ``--out`` folders.

The ledger is one JSON Lines file in the user's state directory (:func:`ledger_path`), one
:class:`LedgerEntry` per certify run (a resumed run or another shard of it adds nothing new). Before a run starts,
:func:`check` refuses (one line) a run whose stream already holds a run of another test on overlapping images,
unless ``new_test``; once the run directory is open, :func:`record` checks again and appends the run's entry under
an exclusive lock on the file (two processes never both pass the check with conflicting tests) and returns how
many tests of those images and stream the ledger holds, this one included. A line that cannot be read is a
one-line error naming the file and the line, never skipped: a lost record would let a conflicting test through.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from transdenoiser.errors import UserError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: O_APPEND lines without the lock
    fcntl = None  # type: ignore[assignment]

FORMAT_VERSION = 1
STATE_ENV = "TRANSDENOISER_STATE_DIR"
LEDGER_FILE = "certify-ledger.jsonl"
LADDER_TEST = "ladder"  # the adaptive runs' one test: decide's one-sided mixture tests on the 0.001 radius grid
LADDER_METHOD = "one-sided-mixture"  # certify.adaptive.LADDER_METHOD (not imported: that module imports torch)
N_MAX_FREE_METHODS = ("one-sided-mixture", "beta-mixture")  # a larger --n-max extends the same test (CERTIFY.md)
SHOWN_RANGES = 6  # ranges of indices a message writes out before "..."


def state_dir() -> Path:
    """Where transdenoiser keeps its state: $TRANSDENOISER_STATE_DIR, else $XDG_STATE_HOME/transdenoiser, else
    ~/.local/state/transdenoiser."""
    base = os.environ.get(STATE_ENV)
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "transdenoiser"


def ledger_path() -> Path:
    """The ledger file in :func:`state_dir`."""
    return state_dir() / LEDGER_FILE


# ----------------------------------------------------------------------------------------------- identities

def stream_key(stream: dict[str, Any]) -> str:
    """The SHA-256 (hex) of ``stream``'s settings as sorted JSON: equal keys, equal votes for every image."""
    return hashlib.sha256(json.dumps(stream, sort_keys=True).encode()).hexdigest()


def identify_test(mode: str | None, n: int, radius: float | None = None, sequential: str = LADDER_METHOD) -> str:
    """Which test a certify run spends: ``ladder`` for adaptive runs with the one-sided mixture (any radius, budget
    and tolerance: one family of tests, :mod:`certify.ladder`); ``clopper-pearson n=N`` for Cohen's fixed n
    (``mode`` None); else the method, mode, radius (decide) and budget ``n`` (left out for beta-mixture, whose looks
    and boundaries do not depend on it). Equal identities on one stream give the same answers."""
    if mode is None:
        return f"clopper-pearson n={n}"
    if sequential == LADDER_METHOD:
        return LADDER_TEST
    parts = [sequential, mode]
    if mode == "decide":
        parts.append(f"radius={radius!r}")
    if sequential not in N_MAX_FREE_METHODS:
        parts.append(f"n_max={n}")
    return " ".join(parts)


def weights_identity(recorded_sha256: str | None, checkpoint: Path | None) -> str:
    """A model's identity in the stream key: the SHA-256 of its weights as its metadata records it (checked when the
    checkpoint was loaded), else of its weights file; ``none`` without a model."""
    if checkpoint is None:
        return "none"
    if recorded_sha256:
        return recorded_sha256
    from transdenoiser.records import WEIGHTS_FILE

    digest = hashlib.sha256()
    with open(Path(checkpoint) / WEIGHTS_FILE, "rb") as weights:
        for block in iter(lambda: weights.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------- image ranges

def compact_ranges(indices: Iterable[int]) -> str:
    """Indices as ``0-99,150,200-209`` (the ``--indices`` syntax), sorted, duplicates dropped."""
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in _intervals(sorted(set(indices))))


def _intervals(ordered: Sequence[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for i in ordered:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def parse_ranges(text: str) -> list[tuple[int, int]]:
    """``0-99,150`` -> [(0, 99), (150, 150)] (inclusive); a ValueError for anything else."""
    ranges = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        lo, hi = int(low), int(high or low)
        if lo < 0 or hi < lo:
            raise ValueError(f"bad range {part!r}")
        ranges.append((lo, hi))
    return ranges


def overlap(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The inclusive ranges in both ``a`` and ``b`` (each a list of inclusive ranges)."""
    a, b = sorted(a), sorted(b)
    both, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            both.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return both


def describe_ranges(ranges: Sequence[tuple[int, int]]) -> str:
    """Ranges for a message: the first SHOWN_RANGES written out, then how many images in all."""
    text = ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges[:SHOWN_RANGES])
    if len(ranges) > SHOWN_RANGES:
        text += f",... ({sum(hi - lo + 1 for lo, hi in ranges)} images)"
    return text


# ----------------------------------------------------------------------------------------------- entries

@dataclass(frozen=True)
class LedgerEntry:
    """One certify run in the ledger (one JSON line; its keys are these fields).

    ``stream_key``: :func:`stream_key` of ``stream`` (what fixes the question and each image's random draws: both
    models' weights, the data, the seed, sigma, noise, precision, compile and the noise device; n0 and alpha change
    the test of that question, not the question, and are part of ``test``); ``images``: the
    run's image indices as :func:`compact_ranges`; ``test``: :func:`identify_test`; ``run_dir``: the run's
    directory (absolute); ``time``: when the run started, local ISO 8601.
    """

    stream_key: str
    stream: dict[str, Any]
    images: str
    test: str
    run_dir: str
    time: str
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=False)

    @classmethod
    def from_json(cls, line: str, where: str) -> LedgerEntry:
        """The entry of one ledger line; a UserError naming ``where`` (file and line) for anything else."""
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{where}: not a JSON line ({exc.msg}): fix or delete the line (it records an earlier "
                            "certification test; deleting it forgets that test)") from None
        if not isinstance(data, dict):
            raise UserError(f"{where}: not a ledger record (a JSON object): fix or delete the line")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise UserError(f"{where}: ledger format version {version!r} is not supported (this version reads "
                            f"{FORMAT_VERSION}): written by another transdenoiser version?")
        kinds = {"stream_key": str, "stream": dict, "images": str, "test": str, "run_dir": str, "time": str}
        bad = [key for key, kind in kinds.items() if not isinstance(data.get(key), kind)]
        if bad:
            raise UserError(f"{where}: ledger record lacks a valid {', '.join(bad)}: fix or delete the line")
        try:
            parse_ranges(data["images"])
        except ValueError:
            raise UserError(f"{where}: ledger record's images {data['images'][:40]!r} are not ranges like 0-99,150: "
                            "fix or delete the line") from None
        return cls(**{key: data[key] for key in (*kinds, "format_version")})

    @property
    def ranges(self) -> list[tuple[int, int]]:
        return parse_ranges(self.images)


def new_entry(stream: dict[str, Any], indices: Iterable[int], test: str, run_dir: Path) -> LedgerEntry:
    """The entry of a run starting now."""
    return LedgerEntry(stream_key=stream_key(stream), stream=dict(stream), images=compact_ranges(indices), test=test,
                       run_dir=str(Path(run_dir).absolute()), time=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def read_entries(path: Path) -> list[LedgerEntry]:
    """All entries of the ledger at ``path`` (none if it does not exist); an unreadable line is a UserError."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read the certification ledger ({exc})") from None
    return _parse(text, path)


def _parse(text: str, path: Path) -> list[LedgerEntry]:
    return [LedgerEntry.from_json(line, f"{path} line {number}")
            for number, line in enumerate(text.splitlines(), 1) if line.strip()]


# ----------------------------------------------------------------------------------------------- the rule

@dataclass(frozen=True)
class Verdict:
    """What the ledger says of a run: ``conflicts`` (entries of other tests on overlapping images of its stream;
    the run needs ``--new-test``) and ``tests`` (the distinct tests of those images and stream, the run's
    included: together they hold at ``tests`` * alpha)."""

    conflicts: tuple[LedgerEntry, ...]
    tests: int


def judge(entries: Sequence[LedgerEntry], entry: LedgerEntry, ignore_dir: bool = False) -> Verdict:
    """The :class:`Verdict` on ``entry`` given the ledger's ``entries``. ``ignore_dir``: entries of the run's own
    directory are no conflict (its settings.json decides: a resume, or another settings the directory refuses)."""
    mine = entry.ranges
    shared = [e for e in entries if e.stream_key == entry.stream_key and overlap(e.ranges, mine)]
    conflicts = tuple(e for e in shared if e.test != entry.test and not (ignore_dir and e.run_dir == entry.run_dir))
    return Verdict(conflicts, len({e.test for e in shared} | {entry.test}))


def refusal(entry: LedgerEntry, conflicts: Sequence[LedgerEntry], path: Path) -> UserError:
    """The one-line refusal of ``entry``, naming the first conflicting run, its images, seed and test."""
    first = conflicts[0]
    others = len({e.run_dir for e in conflicts} - {first.run_dir})
    more = f" (and {others} other run{'s' if others > 1 else ''})" if others else ""
    images = describe_ranges(overlap(first.ranges, entry.ranges))
    return UserError(f"{_shown_dir(first.run_dir)}{more} certified images {images} "
                     f"on seed {first.stream.get('seed')} with {first.test}; another test of the same images and "
                     f"seed ({entry.test}) spends alpha again: pass --new-test to run it, or use another --seed "
                     f"(ledger: {path})")


def _shown_dir(run_dir: str) -> str:
    """A recorded run directory relative to the working directory when it is below it."""
    with contextlib.suppress(ValueError):
        return str(Path(run_dir).relative_to(Path.cwd()))
    return run_dir


def check(entry: LedgerEntry, new_test: bool, path: Path | None = None) -> Verdict:
    """Refuse ``entry`` (a UserError, one line) when the ledger holds another test of its images and stream, unless
    ``new_test`` or the ledger holds this very run already (a resume); reads without the lock (:func:`record` checks
    again under it)."""
    path = path or ledger_path()
    entries = read_entries(path)
    verdict = judge(entries, entry)
    if verdict.conflicts and not new_test and not any(_same_run(e, entry) for e in entries):
        raise refusal(entry, verdict.conflicts, path)
    return verdict


def record(entry: LedgerEntry, new_test: bool, path: Path | None = None) -> Verdict:
    """Check ``entry`` again as :func:`check` does and append it, under an exclusive lock on the ledger (created with
    its folder if missing); a run already there (a resume, another shard) is not written twice. Entries of the run's
    own directory are no conflict: the directory was opened, so its settings agreed with the run's."""
    path = path or ledger_path()
    with _locked(path) as handle:
        handle.seek(0)
        try:
            text = handle.read()
        except UnicodeDecodeError as exc:
            raise UserError(f"{path}: cannot read the certification ledger ({exc})") from None
        entries = _parse(text, path)
        verdict = judge(entries, entry, ignore_dir=True)
        recorded = any(_same_run(e, entry) for e in entries)
        if verdict.conflicts and not new_test and not recorded:
            raise refusal(entry, verdict.conflicts, path)
        if not recorded:
            handle.seek(0, os.SEEK_END)
            handle.write(entry.to_json() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    return verdict


def _same_run(a: LedgerEntry, b: LedgerEntry) -> bool:
    return (a.stream_key, a.images, a.test, a.run_dir) == (b.stream_key, b.images, b.test, b.run_dir)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[Any]:
    """The ledger opened for reading and appending, held under an exclusive ``flock`` (blocking: another run
    holds it only while it checks and appends one line)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - closed below, after the lock is released
    except OSError as exc:
        raise UserError(f"cannot open the certification ledger {path} ({exc.strerror}): set {STATE_ENV} to a "
                        "writable folder") from None
    try:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield handle
    finally:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        handle.close()
