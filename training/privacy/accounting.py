"""Privacy accounting for Poisson-subsampled Gaussian steps (DP-SGD, MMGA) and Gaussian calibration.

Every (epsilon, delta) here is for the add-or-remove-one neighbouring relation, with noise multipliers
z = (std of the Gaussian noise added to the SUM of clipped per-example gradients) / (clipping norm C).

Three analyses, all of one mechanism (T steps, each including every example independently with
probability q, then adding N(0, (z_t C)^2 I) to the clipped sum):

- ``rdp``: the moments accountant (Renyi DP; Abadi et al. 2016, Mironov 2017), computed by
  ``dp_accounting.rdp.RdpAccountant`` over :data:`RDP_ORDERS`. An upper bound on epsilon.
- ``pld``: the privacy loss distribution accountant (Koskela et al.; Doroshenko et al.), computed by
  ``dp_accounting.pld.PLDAccountant``. Its discretisation is pessimistic (``pessimistic_estimate=True``
  in ``from_gaussian_mechanism``; truncated tails go to the infinity mass), so it is an upper bound,
  tight to about :data:`PLD_VALUE_DISCRETIZATION` per step's worth of rounding.
- ``gdp``: Bu et al.'s central-limit approximation, mu = q sqrt(sum_t (exp(1/z_t^2) - 1)), then the
  epsilon of mu-GDP at delta. An APPROXIMATION that can UNDERESTIMATE epsilon: never a guarantee.

Nothing here hand-rolls RDP or PLD; only the two closed-form Gaussian formulas (mu-GDP profile, analytic
Gaussian mechanism of Balle & Wang 2018) are written out, and solved with scipy.
"""
from __future__ import annotations

import functools
import math
import numbers
from collections import Counter
from collections.abc import Callable, Sequence

import dp_accounting
import numpy as np
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS
from scipy import optimize, special

from transdenoiser.errors import UserError

ACCOUNTANTS = ("rdp", "pld", "gdp")

# dp-accounting's default orders (1.1 .. 63, 128 .. 1024) plus a finer and longer tail, so that small
# epsilons (large noise multipliers), whose optimal order is large, are not overestimated by a coarse grid.
# Integer orders cost time in proportion to their size, so the tail is sparse.
RDP_ORDERS: tuple[float, ...] = tuple(sorted(set(DEFAULT_RDP_ORDERS) | set(range(64, 128, 8))
                                             | {160, 192, 320, 384, 768, 1536, 2048, 4096}))

# Width of the privacy-loss grid of the PLD accountant. Rounding is pessimistic whatever the width, so the
# width only trades tightness for time: dp-accounting's default 1e-4 for one or two distinct multipliers,
# 1e-3 for heterogeneous schedules (one PLD per group), and, for large epsilons (where the support of the
# privacy loss, and so the run time, grows), PLD_RELATIVE_DISCRETIZATION times a cheap estimate of epsilon
# (the GDP one), at most PLD_MAX_VALUE_DISCRETIZATION. Measured effect: docs/ACCOUNTING.md.
PLD_VALUE_DISCRETIZATION = 1e-4
PLD_COARSE_VALUE_DISCRETIZATION = 1e-3
PLD_FINE_MAX_GROUPS = 2
PLD_RELATIVE_DISCRETIZATION = 1e-5
PLD_MAX_VALUE_DISCRETIZATION = 1e-2

# Per-step multipliers with more distinct values than this are grouped (see group_noise_multipliers).
MAX_DISTINCT_MULTIPLIERS = 16

# Relative tolerance of noise_multiplier_for_epsilon: the returned multiplier meets the target and is at most
# this much (relatively) above the smallest one that does.
CALIBRATION_RTOL = 1e-3

# The largest noise multiplier calibration will try before declaring a target unreachable.
MAX_NOISE_MULTIPLIER = 1e5

# Documented bounds that keep every answer finite in time (docs/ACCOUNTING.md, "Edge cases"); each errs toward
# more privacy spent:
# - a positive noise multiplier below MIN_NOISE_MULTIPLIER makes every epsilon inf (below it, RDP epsilons
#   exceed 10^5 and the accountants' floating point breaks down);
# - a sample rate below MIN_SAMPLE_RATE is accounted as MIN_SAMPLE_RATE (rounded up);
# - the PLD accountant runs only for at most MAX_PLD_STEPS steps, multipliers of at least
#   PLD_MIN_NOISE_MULTIPLIER and while the RDP epsilon is at most PLD_MAX_EPSILON (its run time grows with
#   each); otherwise ``pld`` is None and the RDP bound stands.
MIN_NOISE_MULTIPLIER = 0.01
MIN_SAMPLE_RATE = 1e-12
MAX_PLD_STEPS = 100_000
PLD_MIN_NOISE_MULTIPLIER = 0.2
PLD_MAX_EPSILON = 1000.0

ANALYSES = {
    "rdp": "RDP moments accountant (dp-accounting RdpAccountant, Poisson-subsampled Gaussian): upper bound",
    "pld": "PLD accountant (dp-accounting PLDAccountant, pessimistic discretisation): upper bound, near-tight",
    "gdp_mu": "Gaussian DP central-limit approximation (Bu et al.) mu; can UNDERESTIMATE epsilon; not a guarantee",
    "gdp_epsilon": ("Gaussian DP central-limit approximation (Bu et al.); can UNDERESTIMATE epsilon; "
                    "not a guarantee"),
}


# ---------------------------------------------------------------------------------------------- validation

def _finite_real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UserError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise UserError(f"{name} must be a finite number, got {value}")
    return value


def _check_sample_rate(sample_rate) -> float:
    """q in (0, 1]; below MIN_SAMPLE_RATE it is rounded UP to it (more privacy spent, never less)."""
    q = _finite_real("sample_rate", sample_rate)
    if not 0 < q <= 1:
        raise UserError(f"sample_rate must lie in (0, 1], got {q}")
    return max(q, MIN_SAMPLE_RATE)


def _check_delta(delta) -> float:
    d = _finite_real("delta", delta)
    if not 0 < d < 1:
        raise UserError(f"delta must lie strictly between 0 and 1, got {d}")
    return d


def _check_epsilon(epsilon, name: str = "epsilon") -> float:
    e = _finite_real(name, epsilon)
    if e <= 0:
        raise UserError(f"{name} must be > 0, got {e}")
    return e


def _check_steps(steps) -> int:
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral):
        raise UserError(f"steps must be an integer, got {steps!r}")
    if steps < 1:
        raise UserError(f"steps must be >= 1, got {steps}")
    return int(steps)


def _check_multipliers(noise_multipliers, steps: int) -> dict[float, int]:
    """{multiplier: number of steps using it}."""
    if isinstance(noise_multipliers, numbers.Real) and not isinstance(noise_multipliers, bool):
        counts = {_finite_real("noise_multiplier", noise_multipliers): steps}
    else:
        try:
            sequence = list(np.asarray(noise_multipliers, dtype=np.float64).reshape(-1))
        except (TypeError, ValueError):
            raise UserError(f"noise_multipliers must be a number or a sequence of numbers, "
                            f"got {noise_multipliers!r}") from None
        if len(sequence) != steps:
            raise UserError(f"noise_multipliers has {len(sequence)} entries but steps is {steps}")
        counts = Counter(float(v) for v in sequence)
    for value in counts:
        if not math.isfinite(value):
            raise UserError(f"noise multipliers must be finite, got {value}")
        if value < 0:
            raise UserError(f"noise multipliers must be >= 0, got {value}")
    return counts


# ---------------------------------------------------------------------------------------------- grouping

def group_noise_multipliers(counts: dict[float, int],
                            max_groups: int = MAX_DISTINCT_MULTIPLIERS) -> tuple[dict[float, int], float]:
    """Bound the number of distinct per-step multipliers, rounding DOWN (less noise: more epsilon).

    With at most ``max_groups`` distinct values, ``counts`` is returned unchanged. Otherwise the sorted values
    are covered greedily by ``max_groups`` runs of the smallest common log-width, and every step takes the
    smallest multiplier of its run (greedy covering is optimal for a given width, so the width found by
    bisection is the smallest possible). Returns ``(grouped_counts, max_relative_rounding_down)``: the
    largest relative decrease any step's multiplier received (0 when exact).
    """
    if max_groups < 1:
        raise UserError(f"max_groups must be >= 1, got {max_groups}")
    if len(counts) <= max_groups:
        return dict(counts), 0.0
    values = np.array(sorted(counts), dtype=np.float64)
    if values[0] == 0.0:  # zero noise means no DP whatever the rest; keep it as its own group
        rest, rounding = group_noise_multipliers({v: c for v, c in counts.items() if v > 0}, max(max_groups - 1, 1))
        return {0.0: counts[0.0], **rest}, rounding
    log_values = np.log(values)

    def run_starts(width: float) -> list[int]:
        starts, index = [], 0
        while index < len(values) and len(starts) <= max_groups:
            starts.append(index)
            index = int(np.searchsorted(log_values, log_values[index] + width, side="right"))
        return starts

    low, high = 0.0, float(log_values[-1] - log_values[0]) * (1 + 1e-12) + 1e-300  # a single run
    for _ in range(60):
        middle = (low + high) / 2
        if len(run_starts(middle)) <= max_groups:
            high = middle
        else:
            low = middle
    starts = run_starts(high)
    grouped: dict[float, int] = {}
    max_rounding = 0.0
    for begin, end in zip(starts, starts[1:] + [len(values)], strict=True):
        representative = float(values[begin])
        grouped[representative] = sum(counts[float(v)] for v in values[begin:end])
        max_rounding = max(max_rounding, 1.0 - representative / float(values[end - 1]))
    return grouped, float(max_rounding)


def _dp_event(sample_rate: float, counts: dict[float, int]) -> dp_accounting.DpEvent:
    events = [dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(z)), count)
        for z, count in sorted(counts.items())]
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


# ---------------------------------------------------------------------------------------------- accountants

def _rdp_epsilon(sample_rate: float, counts: dict[float, int], delta: float) -> float:
    accountant = RdpAccountant(orders=RDP_ORDERS)
    accountant.compose(_dp_event(sample_rate, counts))
    return float(accountant.get_epsilon(delta))


def pld_in_range(steps: int, smallest_multiplier: float, rdp_epsilon: float) -> bool:
    """Whether the PLD accountant runs (see the bounds above MIN_NOISE_MULTIPLIER)."""
    return (steps <= MAX_PLD_STEPS and smallest_multiplier >= PLD_MIN_NOISE_MULTIPLIER
            and rdp_epsilon <= PLD_MAX_EPSILON)


PLD_RANGE = (f"the PLD accountant runs for at most {MAX_PLD_STEPS:,} steps, noise multipliers of at least "
             f"{PLD_MIN_NOISE_MULTIPLIER:g} and an RDP epsilon of at most {PLD_MAX_EPSILON:g}")


def pld_value_discretization(groups: int, epsilon_estimate: float) -> float:
    """Grid width for the PLD accountant (see PLD_VALUE_DISCRETIZATION); never affects validity."""
    base = PLD_VALUE_DISCRETIZATION if groups <= PLD_FINE_MAX_GROUPS else PLD_COARSE_VALUE_DISCRETIZATION
    return min(max(base, PLD_RELATIVE_DISCRETIZATION * epsilon_estimate), max(base, PLD_MAX_VALUE_DISCRETIZATION))


def _pld_epsilon(sample_rate: float, counts: dict[float, int], delta: float, value_discretization: float) -> float:
    return _pld_epsilon_kept(sample_rate, tuple(sorted(counts.items())), delta, value_discretization)


@functools.lru_cache(maxsize=512)
def _pld_epsilon_kept(sample_rate: float, counts: tuple[tuple[float, int], ...], delta: float,
                      value_discretization: float) -> float:
    """The PLD accountant's epsilon, kept: it takes up to seconds, and a calibration and the report that follows
    it (or a test checking that calibration) ask for the same one. A pure function of its arguments."""
    accountant = PLDAccountant(value_discretization_interval=value_discretization)
    accountant.compose(_dp_event(sample_rate, dict(counts)))
    return float(accountant.get_epsilon(delta))


def clear_caches() -> None:
    """Forget every kept answer (calibrations, PLD epsilons): for timing them from scratch."""
    noise_multiplier_for_epsilon.cache_clear()
    _pld_epsilon_kept.cache_clear()


def gdp_mu(sample_rate: float, counts: dict[float, int]) -> float:
    """Bu et al.'s CLT: mu = q sqrt(sum_t (exp(1/z_t^2) - 1)) (an approximation, see module docstring)."""
    with np.errstate(over="ignore", divide="ignore"):
        total = sum(count * float(np.expm1(np.float64(1.0) / np.square(np.float64(z)))) for z, count in counts.items())
    return sample_rate * math.sqrt(total)


def _log_gaussian_delta(epsilon: float, a: float, b: float) -> float:
    """log(Phi(a) - e^eps Phi(b)) for b < a, computed in log space; -inf where it is <= 0."""
    log_first = float(special.log_ndtr(a))
    log_second = epsilon + float(special.log_ndtr(b))
    if log_second >= log_first:
        return -math.inf
    return log_first + math.log(-math.expm1(log_second - log_first))


def gdp_delta(epsilon: float, mu: float) -> float:
    """delta(eps) of mu-GDP: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong, Roth & Su)."""
    return math.exp(_log_gaussian_delta(epsilon, -epsilon / mu + mu / 2, -epsilon / mu - mu / 2))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon with delta(eps) <= delta for mu-GDP, rounded up; inf for mu = inf."""
    if math.isinf(mu):
        return math.inf
    if mu == 0 or gdp_delta(0.0, mu) <= delta:
        return 0.0
    high = max(1.0, mu * mu)
    while gdp_delta(high, mu) > delta:
        high *= 2
    epsilon = optimize.brentq(lambda e: _log_gaussian_delta(e, -e / mu + mu / 2, -e / mu - mu / 2)
                              - math.log(delta), 0.0, high, xtol=1e-12, rtol=1e-12)
    return _round_up(epsilon, lambda e: gdp_delta(e, mu) <= delta)


def _round_up(value: float, satisfied: Callable[[float], bool], rtol: float = 1e-12) -> float:
    """Nudge a root-finder's answer upward until ``satisfied`` holds (it may sit a hair on the wrong side)."""
    step = max(abs(value), 1e-300) * rtol
    while not satisfied(value):
        value += step
        step *= 2
    return value


# ---------------------------------------------------------------------------------------------- public API

def epsilon_report(sample_rate: float, noise_multipliers: float | Sequence[float], steps: int,
                   delta: float, *, max_groups: int = MAX_DISTINCT_MULTIPLIERS) -> dict:
    """(epsilon, delta) of ``steps`` Poisson-subsampled Gaussian steps at rate q = ``sample_rate``.

    ``noise_multipliers``: one float used for every step, or a sequence of ``steps`` per-step multipliers
    (std of the noise on the SUMMED clipped gradient divided by the clipping norm C). A zero multiplier in
    any step makes every epsilon ``inf`` (no DP). Returns a dict with ``rdp``, ``pld``, ``gdp_mu``,
    ``gdp_epsilon``, ``delta``, ``sample_rate``, ``steps``, ``analyses`` (a label per epsilon key) and
    ``multiplier_grouping`` (how per-step multipliers were grouped for the RDP and PLD accountants: more
    than ``max_groups`` distinct values are rounded DOWN onto ``max_groups`` values, see
    :func:`group_noise_multipliers`; the GDP formula always uses the exact values).
    """
    q = _check_sample_rate(sample_rate)
    delta = _check_delta(delta)
    steps = _check_steps(steps)
    counts = _check_multipliers(noise_multipliers, steps)
    base = {"delta": delta, "sample_rate": q, "steps": steps, "analyses": dict(ANALYSES)}
    too_small = sum(count for z, count in counts.items() if z < MIN_NOISE_MULTIPLIER)
    if too_small:
        base["analyses"]["note"] = (f"{too_small} step(s) with a noise multiplier below {MIN_NOISE_MULTIPLIER:g} "
                                    "(0 included): no finite epsilon is claimed")
        return {"rdp": math.inf, "pld": math.inf, "gdp_mu": math.inf, "gdp_epsilon": math.inf, **base,
                "multiplier_grouping": {"distinct_multipliers": len(counts), "groups": len(counts),
                                        "max_relative_rounding_down": 0.0, "zero_noise_steps": counts.get(0.0, 0),
                                        "steps_below_min_noise_multiplier": too_small}}
    grouped, max_rounding = group_noise_multipliers(counts, max_groups)
    base["multiplier_grouping"] = {"distinct_multipliers": len(counts), "groups": len(grouped),
                                   "max_relative_rounding_down": max_rounding}
    mu = gdp_mu(q, counts)  # the CLT formula uses the exact multipliers; it is an approximation anyway
    gdp = gdp_epsilon(mu, delta)
    base["pld_value_discretization"] = pld_value_discretization(len(grouped), gdp)
    if max_rounding > 0:
        note = (f"; {len(counts)} distinct per-step multipliers rounded DOWN onto {len(grouped)} values "
                f"(by at most {100 * max_rounding:.2g}%)")
        base["analyses"]["rdp"] += note
        base["analyses"]["pld"] += note
    rdp = _rdp_epsilon(q, grouped, delta)
    pld = None
    if not pld_in_range(steps, min(grouped), rdp):
        base["analyses"]["pld"] = (f"not computed: {PLD_RANGE} (here: {steps:,} steps, smallest multiplier "
                                   f"{min(grouped):.4g}, RDP epsilon {rdp:.4g}); the RDP bound stands")
    else:
        pld = _pld_epsilon(q, grouped, delta, base["pld_value_discretization"])
    return {"rdp": rdp, "pld": pld, "gdp_mu": mu, "gdp_epsilon": gdp, **base}


def epsilon_for_accountant(accountant: str, sample_rate: float, noise_multiplier: float, steps: int,
                           delta: float) -> float:
    """Epsilon of one accountant (``rdp``, ``pld`` or ``gdp``) for a constant noise multiplier."""
    accountant = _check_accountant(accountant)
    q, delta, steps = _check_sample_rate(sample_rate), _check_delta(delta), _check_steps(steps)
    counts = _check_multipliers(noise_multiplier, steps)
    if min(counts) < MIN_NOISE_MULTIPLIER:
        return math.inf
    if accountant == "rdp":
        return _rdp_epsilon(q, counts, delta)
    gdp = gdp_epsilon(gdp_mu(q, counts), delta)
    if accountant == "pld":
        if not pld_in_range(steps, min(counts), _rdp_epsilon(q, counts, delta)):
            raise UserError(f"{PLD_RANGE}; use the rdp accountant here")
        return _pld_epsilon(q, counts, delta, pld_value_discretization(1, gdp))
    return gdp


def _check_accountant(accountant) -> str:
    if accountant not in ACCOUNTANTS:
        raise UserError(f"accountant must be one of {', '.join(ACCOUNTANTS)}, got {accountant!r}")
    return accountant


@functools.lru_cache(maxsize=256, typed=True)  # typed: 100.0 is validated apart from 100
def noise_multiplier_for_epsilon(target_epsilon: float, sample_rate: float, steps: int, delta: float,
                                 accountant: str = "rdp") -> float:
    """Smallest noise multiplier whose epsilon by ``accountant`` is <= ``target_epsilon``.

    Root finding on log(z) (scipy's brentq) to a relative tolerance of :data:`CALIBRATION_RTOL`, then
    rounded UP and checked with the same accountant, so the returned multiplier never exceeds the target.
    A pure function of its arguments, so its answers are kept (a plan of many runs at the same privacy
    settings calibrates once).
    """
    accountant = _check_accountant(accountant)
    target = _check_epsilon(target_epsilon, "target_epsilon")
    q, delta, steps = _check_sample_rate(sample_rate), _check_delta(delta), _check_steps(steps)

    evaluated: dict[float, float] = {}  # multiplier -> its epsilon, each computed once

    def epsilon_of(z: float) -> float:
        if z not in evaluated:
            evaluated[z] = _epsilon_to_calibrate(accountant, q, z, steps, delta)
        return evaluated[z]

    if accountant == "gdp":
        return _gdp_noise_multiplier(target, q, steps, delta)

    # Bracket around the closed-form GDP answer (close to PLD, a little below RDP), widening as needed.
    high = _gdp_noise_multiplier(target, q, steps, delta) * 1.1
    exceeded = 0.0  # the largest multiplier seen to miss the target
    while epsilon_of(high) > target:
        exceeded = high
        high *= 1.5
        if high > MAX_NOISE_MULTIPLIER:
            raise UserError(f"target_epsilon {target} at delta {delta} is out of reach of the {accountant} "
                            f"accountant for noise multipliers up to {MAX_NOISE_MULTIPLIER:g}")
    # For ``pld`` the bracket never straddles PLD_MIN_NOISE_MULTIPLIER: below it the PLD accountant does not
    # run and the (larger) RDP epsilon decides, a step that root finding would approach one slow PLD
    # evaluation at a time.
    pld_floor = PLD_MIN_NOISE_MULTIPLIER if accountant == "pld" else 0.0

    def next_low(value: float) -> float:
        below = max(value, MIN_NOISE_MULTIPLIER)
        return max(below, pld_floor) if high > pld_floor else below

    # pld: a multiplier already seen to miss the target closes the bracket (its epsilon is kept: no evaluation)
    low = exceeded if accountant == "pld" and exceeded >= pld_floor else next_low(high / 1.2)
    while epsilon_of(low) <= target:
        if low <= MIN_NOISE_MULTIPLIER:  # the floor already meets the target: nothing smaller is accounted
            return MIN_NOISE_MULTIPLIER
        if low <= pld_floor:
            # Every multiplier from `low` up meets the target; below the PLD range RDP decides, and RDP's
            # own calibration is the smallest multiplier it accepts.
            return min(noise_multiplier_for_epsilon(target, q, steps, delta, accountant="rdp"), low)
        high = low
        low = next_low(low / 1.5)
    if accountant == "pld":
        # Epsilon is close to a power of z, so log(epsilon) against log(z) is nearly straight and brentq's
        # interpolation needs fewer evaluations (each takes up to seconds); PLD's 0 at large z maps to a stand-in.
        log_target = math.log(target)
        gap = lambda t: math.log(max(epsilon_of(math.exp(t)), 1e-300)) - log_target  # noqa: E731
    else:
        gap = lambda t: epsilon_of(math.exp(t)) - target  # noqa: E731
    log_root = optimize.brentq(gap, math.log(low), math.log(high), xtol=CALIBRATION_RTOL / 4)
    z = min(math.exp(log_root) * (1 + CALIBRATION_RTOL / 2), high)
    if accountant == "pld":  # a multiplier already evaluated and meeting the target, no larger: no new evaluation
        seen = [value for value in evaluated if evaluated[value] <= target and value <= z]
        z = min(seen) if seen else z
    while epsilon_of(z) > target:  # PLD's epsilon is piecewise constant in z: step up until it holds
        z = min(z * (1 + CALIBRATION_RTOL / 2), high)
    return z


def _epsilon_to_calibrate(accountant: str, q: float, z: float, steps: int, delta: float) -> float:
    """The epsilon a calibration meets: the accountant's, or for ``pld`` beyond its range its upper bound, RDP's."""
    if accountant == "pld" and z >= MIN_NOISE_MULTIPLIER:
        rdp = _rdp_epsilon(q, {z: steps}, delta)
        if not pld_in_range(steps, z, rdp):
            return rdp
    return epsilon_for_accountant(accountant, q, z, steps, delta)


def _gdp_noise_multiplier(target: float, q: float, steps: int, delta: float) -> float:
    """Closed form: solve delta_mu(target) = delta for mu, then invert mu = q sqrt(T (exp(1/z^2) - 1))."""
    def log_delta_gap(log_mu: float) -> float:
        mu = math.exp(log_mu)
        return _log_gaussian_delta(target, -target / mu + mu / 2, -target / mu - mu / 2) - math.log(delta)

    low, high = math.log(1e-3), math.log(1.0)
    while log_delta_gap(low) >= 0:
        low -= 2.0
    while log_delta_gap(high) < 0:
        high += 1.0
    mu = math.exp(optimize.brentq(log_delta_gap, low, high, xtol=1e-13))

    def noise_multiplier(mu_value: float) -> float:
        return 1.0 / math.sqrt(math.log1p(mu_value ** 2 / (q * q * steps)))

    z = noise_multiplier(mu)
    return _round_up(z, lambda value: gdp_epsilon(gdp_mu(q, {value: steps}), delta) <= target, rtol=1e-10)


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest Gaussian std giving (epsilon, delta)-DP for L2 sensitivity D (Balle & Wang 2018, Thm. 8).

    Exact condition: Phi(D/(2s) - eps s/D) - e^eps Phi(-D/(2s) - eps s/D) <= delta, solved with brentq on
    log(s) and rounded up so that the returned s satisfies it. Valid for every epsilon > 0.
    """
    epsilon, delta = _check_epsilon(epsilon), _check_delta(delta)
    sensitivity = _check_epsilon(sensitivity, "sensitivity")

    def log_delta_gap(log_ratio: float) -> float:  # ratio = s / D
        r = math.exp(log_ratio)
        return _log_gaussian_delta(epsilon, 1 / (2 * r) - epsilon * r, -1 / (2 * r) - epsilon * r) - math.log(delta)

    low, high = 0.0, 0.0
    while log_delta_gap(low) < 0:
        low -= 1.0
    while log_delta_gap(high) >= 0:
        high += 1.0
    ratio = math.exp(optimize.brentq(log_delta_gap, low, high, xtol=1e-14))
    ratio = _round_up(ratio, lambda r: gaussian_mechanism_delta(epsilon, r, 1.0) <= delta)
    return ratio * sensitivity


def gaussian_mechanism_delta(epsilon: float, sigma: float, sensitivity: float = 1.0) -> float:
    """Exact delta(epsilon) of the Gaussian mechanism with std ``sigma`` and L2 sensitivity D (Balle & Wang)."""
    r = sigma / sensitivity
    return math.exp(_log_gaussian_delta(epsilon, 1 / (2 * r) - epsilon * r, -1 / (2 * r) - epsilon * r))


def classical_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """sqrt(2 ln(1.25/delta)) D / epsilon (Dwork & Roth, Thm. A.1); only valid for epsilon <= 1."""
    epsilon, delta = _check_epsilon(epsilon), _check_delta(delta)
    sensitivity = _check_epsilon(sensitivity, "sensitivity")
    if epsilon > 1:
        raise UserError(f"the classical Gaussian mechanism bound is only valid for epsilon <= 1, got {epsilon}; "
                        "use analytic_gaussian_sigma")
    return math.sqrt(2 * math.log(1.25 / delta)) * sensitivity / epsilon


def steps_per_epoch(sample_rate: float) -> int:
    """Steps of one epoch at Poisson rate q: round(1/q), at least 1 (the training loop's rule)."""
    if not (math.isfinite(sample_rate) and 0 < sample_rate <= 1):
        raise UserError(f"sample rate q must lie in (0, 1], got {sample_rate}")
    return max(1, round(1 / sample_rate))


def steps_for_epochs(epochs: float, sample_rate: float) -> int:
    """Steps T of ``epochs`` passes at Poisson rate q: :func:`steps_per_epoch` steps per epoch."""
    if not (math.isfinite(epochs) and epochs > 0):
        raise UserError(f"epochs must be > 0, got {epochs}")
    return max(1, math.ceil(epochs * steps_per_epoch(sample_rate) - 1e-9))
