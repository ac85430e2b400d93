"""transdenoiser.stats: the one-sided Clopper-Pearson bound shared by the smoothing core and the baselines."""
import pytest
from statsmodels.stats.proportion import proportion_confint

from transdenoiser.stats import clopper_pearson_lower


@pytest.mark.parametrize(("k", "n", "alpha"), [(1, 10, 0.05), (57, 100, 0.001), (999, 1000, 0.01), (10, 10, 0.1)])
def test_clopper_pearson_lower_is_the_one_sided_beta_bound(k, n, alpha):
    from scipy.stats import beta

    expected = beta.ppf(alpha, k, n - k + 1)  # the alpha quantile of Beta(k, n - k + 1)
    assert clopper_pearson_lower(k, n, alpha) == pytest.approx(expected, rel=1e-9)
    assert clopper_pearson_lower(k, n, alpha) == proportion_confint(k, n, alpha=2 * alpha, method="beta")[0]


def test_no_successes_bound_zero_and_all_successes_alpha_to_one_over_n():
    assert clopper_pearson_lower(0, 50, 0.01) == 0.0
    assert clopper_pearson_lower(50, 50, 0.01) == pytest.approx(0.01 ** (1 / 50), rel=1e-9)


def test_the_smoothing_core_bound_agrees():
    from certify.core import clopper_pearson_lower as core_bound

    for k, n, alpha in ((0, 10, 0.05), (3, 10, 0.05), (870, 1000, 0.001), (1000, 1000, 0.001)):
        assert clopper_pearson_lower(k, n, alpha) == core_bound(k, n, alpha)
