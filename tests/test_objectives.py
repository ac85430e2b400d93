"""Training objectives (training/objectives.py): per-example norms and clipped sums through the frozen classifier
equal a per-example autograd loop with either engine; removing one example moves the clipped sum by at most C;
the classifier stays frozen; each arm trains each objective and records it; the transdenoiser arm refuses all but
MSE; old checkpoints read as MSE."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from training.objectives import OBJECTIVES, Objective, build_objective
from training.privacy.clipping import ClippedGradients, ExecutionPlan
from transdenoiser.errors import UserError

LOSSES = ("mse", "stability", "classification")


class SmallClassifier(nn.Module):
    """A frozen classifier with BatchNorm (running statistics that a training-mode pass would change)."""

    def __init__(self, classes: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.head = nn.Linear(3 * 8 * 8, classes)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).flatten(1))


def _models(seed: int = 0):
    from training.models import build_model

    torch.manual_seed(seed)
    denoiser = build_model("tiny", in_channels=1, width=2, activation="tanh")
    classifier = SmallClassifier()
    with torch.no_grad():  # non-trivial running statistics, so that a change would show
        classifier.bn.running_mean.uniform_(-0.5, 0.5)
        classifier.bn.running_var.uniform_(0.5, 2.0)
    return denoiser, classifier


def _batch(n: int = 6, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand((n, 1, 8, 8), generator=g)
    return x + 0.5 * torch.randn(x.shape, generator=g), x, torch.randint(0, 4, (n,), generator=g)


def _loop(model, objective, z, targets, clip):
    """(per-example norms, clipped sum) one example at a time with torch.autograd: the reference."""
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    total = {k: torch.zeros_like(p) for k, p in zip(names, params, strict=True)}
    norms = []
    for i in range(len(z)):
        loss = objective.row_loss(model(z[i:i + 1]), targets[i:i + 1]).sum()
        grads = torch.autograd.grad(loss, params)
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        norms.append(norm)
        for k, g in zip(names, grads, strict=True):
            total[k] += min(1.0, clip / float(norm)) * g
    return torch.stack(norms), total


def _state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("engine", ["ghost", "vmap"])
def test_clipped_sums_through_the_frozen_classifier_equal_the_per_example_loop(loss, engine):
    denoiser, classifier = _models()
    objective = build_objective(loss, classifier)
    before = _state(classifier)
    z, x, y = _batch()
    targets = objective.targets(x, y)
    clip = float(_loop(denoiser, objective, z, targets, 1.0)[0].median())  # half the examples are clipped
    norms, reference = _loop(denoiser, objective, z, targets, clip)
    row_loss = None if loss == "mse" else objective.row_loss
    clipped = ClippedGradients(denoiser, clip, ExecutionPlan(engine, 0, 0), row_loss=row_loss)(z, targets)
    assert clipped.factors.shape == (6,) and (clipped.factors < 1).any() and (clipped.factors == 1).any()
    expected = (clip / norms).clamp(max=1.0)
    torch.testing.assert_close(clipped.factors, expected, rtol=1e-4, atol=1e-7)
    for k, v in clipped.whole().items():
        torch.testing.assert_close(v, reference[k], rtol=1e-4, atol=1e-6)
    assert all(p.grad is None for p in classifier.parameters())  # no gradient reaches the classifier
    assert all(torch.equal(v, before[k]) for k, v in classifier.state_dict().items())  # BN statistics untouched
    if loss != "mse":
        assert not classifier.training and not any(p.requires_grad for p in classifier.parameters())  # frozen
        # the loss really went through the classifier: other targets, other sums
        other = objective.targets(x, (y + 1) % 4) if loss == "classification" else (targets + 1) % 4
        moved = ClippedGradients(denoiser, clip, ExecutionPlan(engine, 0, 0), row_loss=row_loss)(z, other).whole()
        assert any(not torch.allclose(v, reference[k]) for k, v in moved.items())


@pytest.mark.parametrize("loss", LOSSES)
def test_removing_one_example_moves_the_clipped_sum_by_at_most_c(loss):
    """Each example's loss is its own (its image, label, noise and the frozen classifier): per-example clipping
    bounds what any one example adds to the clipped sum by C, as the privacy analysis needs, with every objective.
    The targets are computed from the batch each time, as the arms compute them."""
    denoiser, classifier = _models(3)
    objective = build_objective(loss, classifier)
    z, x, y = _batch(7, seed=4)
    row_loss = None if loss == "mse" else objective.row_loss
    clip = 0.5 * float(_loop(denoiser, objective, z, objective.targets(x, y), 1.0)[0].min())  # clips every one
    engine = ClippedGradients(denoiser, clip, ExecutionPlan("ghost", 0, 0), row_loss=row_loss)
    whole = engine(z, objective.targets(x, y)).whole()
    moves = []
    for j in range(len(x)):
        keep = [i for i in range(len(x)) if i != j]
        without = engine(z[keep], objective.targets(x[keep], y[keep])).whole()
        moves.append(float(torch.sqrt(sum((whole[k] - without[k]).pow(2).sum() for k in whole))))
    assert max(moves) <= clip * (1 + 1e-4), moves
    assert min(moves) > 0.99 * clip  # every example is clipped here: each moves the sum by C


def test_a_classifier_in_training_mode_is_refused():
    """Batch statistics would make one example's loss depend on the others (and change BatchNorm's buffers)."""
    _, classifier = _models()
    objective = build_objective("stability", classifier)
    classifier.train()
    z, x, y = _batch()
    with pytest.raises(ValueError, match="eval mode"):
        objective.targets(x)
    with pytest.raises(ValueError, match="eval mode"):
        objective.row_loss(z, y)


def test_the_classifier_stays_frozen_through_dp_steps():
    """A few sepdp steps with the stability objective: the classifier never runs in training mode or with a
    parameter that requires a gradient, gets no gradient, and its weights and BatchNorm statistics are unchanged,
    while the denoiser's weights move."""
    from training.arms import SepDPArm
    from training.train_config import TrainConfig

    denoiser, classifier = _models(5)
    before, denoiser_before = _state(classifier), _state(denoiser)
    seen = []
    classifier.register_forward_pre_hook(
        lambda m, _: seen.append((m.training, any(p.requires_grad for p in m.parameters()))))
    config = TrainConfig(arm="sepdp", objective="stability", clip_norm=1.0, clipping="ghost", sigma=0.5)
    arm = SepDPArm(denoiser, config, 1.0, 4.0, 10, objective=build_objective("stability", classifier))
    optimizer = torch.optim.SGD(denoiser.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(0)
    for step in range(3):
        x = _batch(5, seed=10 + step)[1]
        grads, record = arm.gradient(x, generator)
        for name, p in denoiser.named_parameters():
            p.grad = grads[name]
        optimizer.step()
        assert record.batch_size == 5
    assert seen and all(mode == (False, False) for mode in seen)
    assert all(p.grad is None for p in classifier.parameters())
    assert all(torch.equal(v, before[k]) for k, v in classifier.state_dict().items())
    assert any(not torch.equal(v, denoiser_before[k]) for k, v in denoiser.state_dict().items())


def test_objective_settings_are_checked_in_one_line():
    from training.train_config import TrainConfig

    with pytest.raises(UserError, match="transdenoiser arm: its privacy analysis .* quadratic MSE loss only"):
        TrainConfig(arm="transdenoiser", objective="stability").validate(100)
    for objective in OBJECTIVES[1:]:
        with pytest.raises(UserError, match="refused by the transdenoiser arm"):
            TrainConfig(arm="transdenoiser", objective=objective).validate(100)
        TrainConfig(arm="sepdp", objective=objective).validate(100)  # the DP-SGD arm takes every objective
    with pytest.raises(UserError, match="objective must be one of"):
        TrainConfig(arm="sepdp", objective="psnr").validate(100)
    with pytest.raises(UserError, match="train_on must be private"):
        TrainConfig(arm="nodp", objective="stability+mse", train_on="public").validate(100)
    with pytest.raises(UserError, match="--noise isotropic"):
        TrainConfig(arm="sepdp", objective="stability", noise="shaped").validate(100)
    with pytest.raises(ValueError, match="needs the private labels"):
        Objective("classification").targets(torch.zeros(2, 1, 8, 8))


def test_choices_config_files_and_old_checkpoints(tmp_path):
    from training import choices, objectives
    from training.methods import get_method
    from training.methods.base import SettingsSource
    from training.train_config import load_config_file
    from transdenoiser.records import CheckpointMetadata

    assert choices.OBJECTIVES == objectives.OBJECTIVES
    path = tmp_path / "run.toml"
    path.write_text('arm = "sepdp"\nobjective = "stability+mse"\n')
    assert load_config_file(path).objective == "stability+mse"
    recipe = get_method("recipe").config_from_settings({"objective": "classification", "target_epsilon": 1.0},
                                                       SettingsSource("test", {}))
    assert recipe.objective == "classification"
    with pytest.raises(UserError, match="refused by the transdenoiser arm"):
        get_method("transdenoiser").config_from_settings({"objective": "stability"},
                                                         SettingsSource("test", {})).validate(100)
    old = {"kind": "denoiser", "architecture": "tiny", "config": {"arm": "sepdp", "sigma": 0.25}}
    assert CheckpointMetadata.from_json(old).training_objective == "mse"  # written before objectives existed
    new = CheckpointMetadata.from_json({**old, "objective": "stability"})
    assert new.training_objective == "stability" and new.to_json()["objective"] == "stability"
    assert CheckpointMetadata.from_json({"kind": "classifier", "architecture": "cnn28"}).training_objective is None


def _tiny_data():
    """A 3-class in-memory data set of 8x8 images (public, private with labels, test) and a frozen linear
    classifier for it."""
    import numpy as np

    from training.evaluation import FrozenClassifier
    from transdenoiser.api import _in_memory_dataset

    rng = np.random.default_rng(0)
    images = rng.random((112, 1, 8, 8), dtype=np.float32)
    labels = rng.integers(0, 3, 112)
    data = _in_memory_dataset(images[:64], images[96:], labels[96:], 3, "tiny", labels[:64], public=images[64:96])
    torch.manual_seed(0)
    module = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    return data, FrozenClassifier(model=module, architecture="python:Sequential", input_shape=(1, 8, 8),
                                  num_classes=3, path="in-memory")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One tiny run per arm (nodp, sepdp, the recipe) and objective, each saved: {(arm, objective): directory}."""
    from training.methods import get_method
    from training.methods.base import Hooks, SettingsSource

    data, classifier = _tiny_data()
    root = tmp_path_factory.mktemp("objectives")
    out = {}
    for arm in ("nodp", "sepdp", "recipe"):
        # the recipe calibrates its noise (seconds): the reference's recipe and one more objective
        for objective in OBJECTIVES if arm != "recipe" else ("classification", "stability+mse"):
            settings = {"objective": objective, "denoiser": "tiny", "denoiser_kwargs": {"width": 2}, "epochs": 1,
                        "batch_size": 32, "reproducible_noise": True, "seed": 0}
            if arm != "nodp":
                settings.update({"clipping": "ghost", "delta": 1e-3},
                                **({"target_epsilon": 8.0} if arm == "recipe" else {}))
            method = get_method(arm)
            config = method.config_from_settings(settings, SettingsSource("test", {}))
            directory = root / f"{arm}-{objective.replace('+', '-')}"
            method.train(config, data, classifier, torch.device("cpu"), Hooks(), out=directory)
            out[(arm, objective)] = directory
    return out


def test_each_arm_trains_each_objective_and_records_it(runs):
    from training.checkpoint import load_checkpoint
    from transdenoiser.records import CheckpointMetadata

    weights = {}
    for (arm, objective), directory in runs.items():
        meta = json.loads((directory / "metadata.json").read_text())
        record = CheckpointMetadata.from_json(meta)
        assert meta["objective"] == meta["config"]["objective"] == record.training_objective == objective
        assert record.arm == ("sepdp" if arm == "recipe" else arm)
        init = meta["privacy"]["initialisation"]
        if objective == "stability+mse":  # MSE on the public split first: recorded as a public initialisation
            assert init["kind"] == "public" and init["phase"]["objective"] == "mse" and init["weights_sha256"]
            assert init["phase"]["train_on"] == "public"
        else:
            assert init["kind"] == "random"
        weights[(arm, objective)] = load_checkpoint(directory, kind="denoiser").model.state_dict()
    for arm in ("nodp", "sepdp"):  # the objective changes what is trained
        first = weights[(arm, "mse")]
        for objective in OBJECTIVES[1:]:
            assert any(not torch.equal(first[k], v) for k, v in weights[(arm, objective)].items()), (arm, objective)


def test_the_model_card_names_the_objective(runs, random_classifier_dir, tmp_path):
    from serving.bundle import load_model_dir, write_model_dir
    from serving.card import model_card
    from training.checkpoint import save_checkpoint
    from training.models import build_model

    kwargs = {"in_channels": 1, "width": 2}
    for objective in (None, "classification"):  # None: a checkpoint written before objectives were recorded
        meta = {"kind": "denoiser", "architecture": "tiny", "arch_kwargs": kwargs, "input_shape": [1, 28, 28],
                "sigma": 0.25, **({"objective": objective} if objective else {})}
        denoiser = save_checkpoint(tmp_path / f"den-{objective}", build_model("tiny", **kwargs), meta)
        model_dir = write_model_dir(tmp_path / f"model-{objective}", random_classifier_dir, denoiser, sigma=0.25)
        card = model_card(load_model_dir(model_dir), "cpu", "one round per pass")
        assert card["denoiser"]["objective"] == (objective or "mse")


def test_the_api_trains_each_objective_and_checks_its_data():
    from transdenoiser.api import train_private_denoiser

    torch.manual_seed(0)
    classifier = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    g = torch.Generator().manual_seed(0)
    images, labels = torch.rand((24, 1, 8, 8), generator=g), torch.randint(0, 3, (24,), generator=g)
    test = (torch.rand((8, 1, 8, 8), generator=g), torch.randint(0, 3, (8,), generator=g))
    common = {"test": test, "arm": "sepdp", "epochs": 1, "batch_size": 8, "noise_multiplier": 1.0, "delta": 1e-3,
              "denoiser": "tiny", "denoiser_kwargs": {"width": 2}, "clipping": "ghost"}
    with pytest.raises(UserError, match="labels are needed"):
        train_private_denoiser(classifier, images, objective="classification", **common)
    with pytest.raises(UserError, match="no public split"):
        train_private_denoiser(classifier, images, objective="stability+mse", **common)
    for objective, data, extra in (("classification", (images, labels), {}),
                                   ("stability+mse", images, {"public": torch.rand((16, 1, 8, 8), generator=g)})):
        model, report = train_private_denoiser(classifier, data, objective=objective, **common, **extra)
        assert report.arm == "sepdp" and model(images[:2]).shape == (2, 1, 8, 8)
        initialisation = report.to_json()["initialisation"]
        assert initialisation["kind"] == ("public" if objective == "stability+mse" else "random")
    assert classifier.training and all(p.requires_grad for p in classifier.parameters())  # restored after


def test_bench_training_objectives_quick_times_each_objective_against_mse(tmp_path):
    from benchmarks import bench_training

    out = tmp_path / "objectives.json"
    assert bench_training.main(["--quick", "--objectives", "stability", "classification", "--only", "autoencoder:8",
                                "--clipping", "ghost", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    (entry,) = result["objectives"].values()
    assert set(entry["rows"]) == {"nonprivate_sgd", "sepdp_mse", "sepdp_stability", "sepdp_classification"}
    assert entry["rows"]["sepdp_mse"]["over_sepdp_mse"] == 1.0
    for name in ("sepdp_stability", "sepdp_classification"):
        row = entry["rows"][name]
        assert row["over_sepdp_mse"] > 0 and row["execution"]["clipping"] == "ghost"
