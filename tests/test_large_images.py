"""3x224x224 images end to end: a generated imagefolder, a torchvision classifier (random weights) and a DnCNN
denoiser through train, certify, attack and serve. Tiny on purpose (8 images, a few noisy samples): the shapes,
the files and the refusals are under test, not accuracy (resnet50 itself runs in benchmarks/bench_certify.py
--pipeline imagenet and scripts/gpu_check.sh)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.conftest import run_cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SIDE = 224


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """imagefolder: two classes of four 224x224 RGB PNGs each (public 4, private 2, test 2 after the split)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("imagefolder224")
    rng = np.random.default_rng(0)
    for label, name in enumerate(("cat", "dog")):
        (root / name).mkdir()
        for i in range(4):
            pixels = rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)
            pixels[..., label] = 220
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def torchvision_classifier(tmp_path_factory):
    """torchvision mobilenet_v3_small, random weights, saved as a 2-class 3x224x224 classifier checkpoint."""
    from training.checkpoint import save_checkpoint
    from training.models import build_model

    torch.manual_seed(0)
    kwargs = {"num_classes": 2}
    meta = {"kind": "classifier", "architecture": "torchvision:mobilenet_v3_small", "arch_kwargs": kwargs,
            "num_classes": 2, "input_shape": [3, SIDE, SIDE], "class_names": ["cat", "dog"], "test_accuracy": None,
            "dataset": {"name": "imagefolder", "trained_on": "public"}}
    return save_checkpoint(tmp_path_factory.mktemp("tv") / "classifier",
                           build_model("torchvision:mobilenet_v3_small", **kwargs), meta)


def test_train_certify_attack_and_serve_at_224(folder, torchvision_classifier, tmp_path, capsys):
    data = ["--dataset", "imagefolder", "--data-root", folder, "--device", "cpu"]
    denoiser = tmp_path / "denoiser"
    code, out, err = run_cli(["train", *data, "--classifier", torchvision_classifier, "--arm", "sepdp",
                              "--denoiser", "dncnn", "--dncnn-depth", "3", "--denoiser-width", "8", "--epochs", "1",
                              "--batch-size", "2", "--eval-examples", "1", "--target-epsilon", "8", "--out", denoiser],
                             capsys)
    assert code == 0, err
    assert json.loads((denoiser / "metadata.json").read_text())["input_shape"] == [3, SIDE, SIDE]

    run = tmp_path / "certify"
    code, out, err = run_cli(["certify", *data, "--classifier", torchvision_classifier, "--denoiser", denoiser,
                              "--sigma", "0.25", "--n0", "2", "--n", "6", "--batch-size", "8", "--precision", "bf16",
                              "--out", run], capsys)
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["images"] == 2 and summary["settings"]["precision"] == "bfloat16"
    assert summary["classifier_metadata"]["input_shape"] == [3, SIDE, SIDE]

    attack = tmp_path / "attack"
    code, out, err = run_cli(["attack", *data, "--classifier", torchvision_classifier, "--denoiser", denoiser,
                              "--sigma", "0.25", "--attack", "pgd", "--eps", "0.5", "--steps", "1", "--eot", "1",
                              "--n", "4", "--max-images", "1", "--out", attack], capsys)
    assert code == 0, err
    record = json.loads((attack / "attack.json").read_text())
    assert record["num_images"] == 1 and record["results"][0]["max_norm"] <= 0.5 + 1e-4

    from serving.bundle import write_model_dir
    from tests.conftest import in_process_service

    model_dir = write_model_dir(tmp_path / "served", torchvision_classifier, denoiser, sigma=0.25, n0=2, n=4,
                                max_n=8, batch_size=8, chunk_samples=2, round_samples=4, max_images=1,
                                max_payload_bytes=4 * 1024 * 1024, allow_client_seed=True)
    image = np.random.default_rng(1).random((3, SIDE, SIDE)).round(3)
    with in_process_service(model_dir) as client:
        card = client.post("/metadata", json={}).json()
        assert card["input"]["shape"] == [3, SIDE, SIDE] and card["runtime"]["precision"] == "fp32"
        response = client.post("/predict", json={"images": [image.tolist()], "n": 4, "seed": 1})
        assert response.status_code == 200, response.text
        assert response.json()["predictions"][0]["n"] == 4
