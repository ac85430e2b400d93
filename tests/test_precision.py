"""Precision (fp32/bf16/fp16 autocast) and torch.compile as part of the certified model: they run on CPU, are
recorded in every artifact (settings, summary, report, serving.toml, model card, attack.json) and refused where
runs would mix (resume, merge, overlay, audit)."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from certify import numerics
from certify.batching import batch_from_memory
from certify.core import Smooth
from tests.conftest import run_cli
from transdenoiser.errors import UserError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAST = ["--sigma", "0.25", "--n0", "8", "--n", "40", "--batch-size", "64", "--alpha", "0.01", "--device", "cpu",
        "--max-index", "3"]


class Margin(nn.Module):
    """Two classes by the sign of the pixel mean, with a wide margin: every precision votes the same."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 1, bias=False)
        nn.init.constant_(self.conv.weight, 1.0)

    def forward(self, x):
        score = self.conv(x).mean(dim=(1, 2, 3)) * 20 - 10
        return torch.stack([-score, score], dim=1)


def test_precision_names_and_refusals():
    assert [numerics.canonical_precision(p) for p in ("fp32", "bf16", "fp16", "bfloat16")] == [
        "float32", "bfloat16", "float16", "bfloat16"]
    with pytest.raises(UserError, match="precision must be one of fp32, bf16, fp16"):
        numerics.canonical_precision("int8")
    with pytest.raises(UserError, match="precision"):
        Smooth(Margin(), 2, 0.25, device="cpu", precision="fp8")
    with pytest.raises(UserError, match="compile must be true or false"):
        Smooth(Margin(), 2, 0.25, device="cpu", compile="yes")
    assert numerics.default_memory_format(torch.device("cpu"), False, True) == "channels_last"
    assert numerics.default_memory_format(torch.device("cuda"), False, True) == "contiguous"
    assert numerics.default_memory_format(torch.device("cuda"), True, True) == "channels_last"
    assert numerics.default_memory_format(torch.device("cpu"), False, False) == "contiguous"


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_every_precision_runs_on_cpu_and_reports_itself(precision):
    smooth = Smooth(Margin(), 2, 0.1, batch_size=16, device="cpu", precision=precision)
    images = torch.stack([torch.full((1, 4, 4), 0.9), torch.full((1, 4, 4), 0.1)])
    counts = smooth.sample_counts_many(images, [5, 40], [smooth.image_generator(0, i) for i in range(2)])
    assert counts.sum(axis=2).tolist() == [[5, 40], [5, 40]]
    assert counts[0, :, 1].tolist() == [5, 40] and counts[1, :, 0].tolist() == [5, 40]
    assert smooth.base_logits(images).dtype == torch.float32  # logits come back as float32 whatever ran
    assert smooth.describe().startswith(numerics.canonical_precision(precision))
    smooth.close()


def test_compiled_pipeline_counts_like_the_eager_one():
    """torch.compile (inductor, on CPU): the same votes as eager on a model far from ties."""
    eager = Smooth(Margin(), 2, 0.3, batch_size=32, device="cpu", workers=1)
    compiled = Smooth(Margin(), 2, 0.3, batch_size=32, device="cpu", workers=1, compile=True)
    images = torch.stack([torch.full((1, 4, 4), 0.6), torch.full((1, 4, 4), 0.4)])
    gens = lambda s: [s.image_generator(3, i) for i in range(2)]  # noqa: E731
    # 100 samples per image in passes of 32: the last pass (4 samples) is padded to 32, one graph for all
    assert (compiled.sample_counts_many(images, [100], gens(compiled))
            == eager.sample_counts_many(images, [100], gens(eager))).all()
    assert compiled.base_logits(images).shape == (2, 2)  # a batch smaller than a pass, padded and cut back
    assert "torch.compile" in compiled.describe() and "eager" in eager.describe()


def test_batch_from_free_memory():
    assert batch_from_memory(free_bytes=80 << 30, bytes_per_sample=1 << 20, cap=4096) == 4096
    assert batch_from_memory(free_bytes=1 << 30, bytes_per_sample=3 << 20, cap=4096) == 128  # 170 -> 128
    assert batch_from_memory(free_bytes=1 << 20, bytes_per_sample=8 << 20, cap=4096) == 1
    with pytest.raises(ValueError):
        batch_from_memory(free_bytes=1 << 30, bytes_per_sample=0, cap=4096)


def test_precision_is_recorded_and_runs_of_other_precisions_never_mix(random_classifier_dir, tmp_path, capsys):
    clf = ["--classifier", random_classifier_dir]
    bf16, fp32 = tmp_path / "bf16", tmp_path / "fp32"
    code, out, err = run_cli(["certify", *clf, *FAST, "--precision", "bf16", "--out", bf16], capsys)
    assert code == 0, err
    summary = json.loads((bf16 / "summary.json").read_text())
    assert summary["settings"]["precision"] == "bfloat16" and summary["settings"]["compile"] is False
    assert "base classifier as run: bfloat16 autocast, eager, channels_last" in (bf16 / "report.md").read_text()
    # resuming the same folder at another precision is refused, naming it
    code, _, err = run_cli(["certify", *clf, *FAST, "--out", bf16], capsys)
    assert code == 2 and "precision 'bfloat16' there, 'float32' now" in err
    code, _, err = run_cli(["certify", *clf, *FAST, "--out", fp32], capsys)
    assert code == 0
    settings = json.loads((fp32 / "settings.json").read_text())
    assert settings["precision"] == "float32" and settings["compile"] is False
    code, _, err = run_cli(["report", bf16, fp32, "--out", tmp_path / "overlay"], capsys)
    assert code == 2 and "refusing to overlay runs of different base classifiers" in err
    assert len(err.strip().splitlines()) == 1
    # shards of one run at two precisions are refused at the merge
    shards = []
    for index, precision in ((0, "bf16"), (1, "fp32")):
        shards.append(tmp_path / f"shard{index}")
        code, _, err = run_cli(["certify", *clf, *FAST, "--precision", precision, "--shard", f"{index}/2",
                                "--out", shards[-1]], capsys)
        assert code == 0, err
    code, _, err = run_cli(["certify-merge", *shards, "--out", tmp_path / "merged"], capsys)
    assert code == 2 and "refusing to merge runs of different base classifiers" in err and "precision" in err
    # the audit re-predicts with the classifier as certified: another precision is refused
    code, _, err = run_cli(["audit", bf16, "--precision", "fp32", "--n", "20", "--steps", "1", "--m", "1"], capsys)
    assert code == 2 and "was certified at bf16" in err


def test_legacy_runs_without_the_new_settings_still_resume(random_classifier_dir, tmp_path, capsys):
    out = tmp_path / "old"
    code, _, err = run_cli(["certify", "--classifier", random_classifier_dir, *FAST, "--out", out], capsys)
    assert code == 0, err
    settings = json.loads((out / "settings.json").read_text())
    settings.pop("compile")
    (out / "settings.json").write_text(json.dumps(settings))
    code, _, err = run_cli(["certify", "--classifier", random_classifier_dir, *FAST, "--out", out], capsys)
    assert code == 0, err


def test_serving_config_and_card_carry_the_precision(random_classifier_dir, tmp_path):
    from serving.bundle import load_model_dir, write_model_dir
    from serving.card import model_card
    from serving.config import validate_config

    with pytest.raises(UserError, match="precision must be one of"):
        validate_config({"sigma": 0.25, "precision": "half"}, "serving.toml")
    with pytest.raises(UserError, match="compile must be true or false"):
        validate_config({"sigma": 0.25, "compile": "yes"}, "serving.toml")
    model_dir = write_model_dir(tmp_path / "served", random_classifier_dir, sigma=0.25, precision="bf16")
    assert 'precision = "bf16"' in (model_dir / "serving.toml").read_text()
    bundle = load_model_dir(model_dir)
    assert bundle.config.precision == "bf16" and bundle.config.compile is False
    smooth = Smooth(bundle.pipeline.classifier, 10, 0.25, device="cpu", precision=bundle.config.precision)
    card = model_card(bundle, "cpu", "one at a time", smooth.describe())
    assert card["runtime"]["precision"] == "bf16"
    assert card["runtime"]["base_classifier_as_run"].startswith("bfloat16 autocast")
