"""Mixed derivatives A_i and S_min: exact, and never overestimated."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import grad

from training.models import build_model
from training.privacy import smin as smin_module
from training.privacy.dp import functional_example_loss, model_params
from training.privacy.smin import (
    mixed_derivative_gram,
    mixed_derivatives,
    smallest_eigenvalue_lower_bound,
    smin_lower_bound,
)

SHAPE = (1, 6, 6)  # v = 36: tiny models and fast tests


def tiny(activation="silu", width=2, seed=0):
    torch.manual_seed(seed)
    return build_model("tiny", activation=activation, width=width)  # w = 77 at width 2


def images(n, seed=1):
    return torch.rand((n, *SHAPE), generator=torch.Generator().manual_seed(seed))


def flat_grad(model, inp, target):
    params, buffers = model_params(model, torch.float64)
    g = grad(functional_example_loss(model))(params, buffers, inp, target)
    return torch.cat([g[k].reshape(-1) for k in params])


@pytest.mark.parametrize("mode", ["fwd", "rev"])
def test_mixed_derivative_matches_central_differences(mode):
    model = tiny("tanh")
    x = images(2).to(torch.float64)
    a = mixed_derivatives(model, x, mode=mode)
    assert a.shape == (2, 77, 36)
    h = 1e-5
    columns = range(0, 36, 5)
    for i in range(2):
        fd = torch.empty(77, 36, dtype=torch.float64)
        for k in columns:
            e = torch.zeros(36, dtype=torch.float64)
            e[k] = h
            e = e.view(SHAPE)
            fd[:, k] = (flat_grad(model, x[i] + e, x[i]) - flat_grad(model, x[i] - e, x[i])) / (2 * h)
        cols = list(columns)
        assert torch.allclose(a[i][:, cols], fd[:, cols], rtol=1e-6, atol=1e-8), float((a[i] - fd)[:, cols].abs().max())


def test_gram_is_scaled_sum_of_outer_products():
    model = tiny()
    x, s = images(3), torch.tensor([1.0, 0.5, 0.1])
    a = mixed_derivatives(model, x)
    expected = sum(float(s[i]) ** 2 * a[i] @ a[i].T for i in range(3))
    gram = mixed_derivative_gram(model, x, s, chunk_size=2)
    assert torch.allclose(gram, expected, rtol=1e-12, atol=1e-12)


def test_eigenvalue_lower_bound_on_dense_matrix():
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.standard_normal((50, 50)))
    eigenvalues = np.geomspace(1e-3, 1e3, 50)
    matrix = (q * eigenvalues) @ q.T
    matrix = (matrix + matrix.T) / 2
    value, raw, bound = smallest_eigenvalue_lower_bound(torch.from_numpy(matrix), inner_dim=50)
    exact = np.linalg.eigvalsh(matrix)[0]
    assert value <= exact  # errs low
    assert exact - value < 1e-6 and bound > 0
    assert abs(raw - np.linalg.svd(matrix, compute_uv=False)[-1]) < 1e-9


def test_smin_matches_numpy_on_smooth_tiny_model():
    model = tiny("silu")
    x, s = images(8), torch.ones(8)
    result = smin_lower_bound(model, x, s)
    assert result.method == "eigvalsh"
    a = mixed_derivatives(model, x).numpy()
    k = sum(a[i] @ a[i].T for i in range(8))
    exact = np.linalg.eigvalsh(k)[0]
    assert 0 < result.value <= exact
    assert exact - result.value <= result.rounding_bound + 1e-15
    assert result.value < 1.0  # small on a tiny model


@pytest.mark.parametrize("activation", ["tanh", "softplus"])
def test_other_smooth_activations_positive(activation):
    assert smin_lower_bound(tiny(activation), images(8), torch.ones(8)).value > 0


def test_relu_gives_zero():
    # ReLU units can be rescaled (in by a, out by 1/a) without changing g: a null direction of every A_i^T
    result = smin_lower_bound(tiny("relu"), images(8), torch.ones(8))
    assert result.value == 0.0
    assert result.method in ("eigvalsh", "zero_row")


def test_shortcuts_compute_nothing(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("K must not be formed")

    monkeypatch.setattr(smin_module, "mixed_derivative_gram", boom)
    model = tiny()
    assert smin_lower_bound(model, images(2), torch.ones(2)).method == "rank_bound"  # 77 > 2 * 36
    assert smin_lower_bound(model, images(0), torch.ones(0)).method == "empty"
    too_large = smin_lower_bound(model, images(8), torch.ones(8), max_dim=50)
    assert too_large.method == "too_large" and too_large.value == 0.0


def test_zero_row_shortcut():
    model = tiny("relu")
    with torch.no_grad():
        model.net[0].bias.fill_(-100.0)  # every first-layer unit dead: their weights never matter
    result = smin_lower_bound(model, images(8), torch.ones(8))
    assert result.method == "zero_row" and result.value == 0.0
