"""import-classifier: 1-channel first layers, wrappers and prefixes, exact mismatch messages, chance level,
--overwrite."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.test_datasets import make_mnist_layout
from training.checkpoint import load_checkpoint
from transdenoiser.cli import main

MEAN, STD = 0.1307, 0.3081


@pytest.fixture(scope="module")
def mnist_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    make_mnist_layout(root, "MNIST", n_train=20, n_test=10, compress=False)  # test labels 0..9, one each
    return root


def one_channel_resnet18(num_classes: int = 10) -> nn.Module:
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None, num_classes=num_classes)
    net.conv1 = nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    return net.eval()


def run_import(mnist_root, weights, out, *extra):
    return main(["import-classifier", "--dataset", "mnist", "--data-root", str(mnist_root), "--arch", "resnet18",
                 "--weights", str(weights), "--out", str(out), "--mean", str(MEAN), "--std", str(STD), *extra])


def test_one_channel_weights_in_a_wrapper_with_prefix_keep_their_logits(mnist_root, tmp_path, capsys):
    from training.datasets import load_dataset

    net = one_channel_resnet18()
    torch.save({"state_dict": {f"module.{k}": v for k, v in net.state_dict().items()}, "epoch": 3},
               tmp_path / "r18.pt")
    assert run_import(mnist_root, tmp_path / "r18.pt", tmp_path / "ckpt") == 0
    err = capsys.readouterr().err
    assert "'state_dict'" in err and "'module.'" in err and "1-channel first layer conv1.weight" in err
    checkpoint = load_checkpoint(tmp_path / "ckpt", kind="classifier")
    assert checkpoint.metadata["input_shape"] == [1, 28, 28]
    x, _ = load_dataset("mnist", mnist_root).test.tensors()
    with torch.inference_mode():
        expected = net((x - MEAN) / STD)  # the user's own network, computed independently
        assert torch.allclose(checkpoint.model(x), expected, atol=1e-5)


def test_mismatch_names_keys_and_shapes_on_one_line(mnist_root, tmp_path, capsys):
    state = one_channel_resnet18(num_classes=1000).state_dict()
    del state["layer1.0.bn1.weight"]
    state["extra.weight"] = torch.zeros(3)
    torch.save(state, tmp_path / "bad.pt")
    assert run_import(mnist_root, tmp_path / "bad.pt", tmp_path / "out") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    line = lines[0]
    assert "fc.weight: file [1000, 512], model [10, 512]" in line
    assert "fc.bias: file [1000], model [10]" in line
    assert "missing key(s): layer1.0.bn1.weight" in line
    assert "unexpected key(s): extra.weight" in line
    assert "1000 outputs" in line and "10 classes" in line
    assert not (tmp_path / "out").exists()


def test_channel_mismatch_names_both(mnist_root, tmp_path, capsys):
    import torchvision

    torch.save(torchvision.models.resnet18(weights=None, num_classes=10).state_dict(), tmp_path / "rgb.pt")
    assert run_import(mnist_root, tmp_path / "rgb.pt", tmp_path / "out") == 2
    line = capsys.readouterr().err.strip()
    assert "conv1.weight takes 3-channel images" in line and "have 1 channel" in line and "\n" not in line


def test_chance_level_classifier_warns(mnist_root, tmp_path, capsys):
    net = one_channel_resnet18()
    with torch.no_grad():  # always answers class 3: exactly 1 of the 10 test images (labels 0..9) is right
        net.fc.weight.zero_()
        net.fc.bias.copy_(torch.nn.functional.one_hot(torch.tensor(3), 10).float() * 10)
    torch.save(net.state_dict(), tmp_path / "const.pt")
    assert run_import(mnist_root, tmp_path / "const.pt", tmp_path / "ckpt") == 0
    captured = capsys.readouterr()
    assert "test accuracy 0.1000" in captured.out
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "chance level for 10 classes" in warnings[0]


def test_chance_level_threshold():
    from training.cli import chance_level_warning

    assert chance_level_warning(0.149, 10, "x") is not None
    assert chance_level_warning(0.151, 10, "x") is None
    assert chance_level_warning(0.74, 2, "x") is not None and chance_level_warning(0.76, 2, "x") is None


def test_existing_out_is_never_overwritten_without_flag(mnist_root, tmp_path, capsys):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    net = one_channel_resnet18()
    torch.save(net.state_dict(), tmp_path / "r18.pt")
    assert run_import(mnist_root, tmp_path / "r18.pt", out) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "precious.txt").read_text() == "keep me"
    assert main(["pretrain", "--out", str(out), "--epochs", "1"]) == 2  # refused before any training
    assert "--overwrite" in capsys.readouterr().err
    assert run_import(mnist_root, tmp_path / "r18.pt", out, "--overwrite") == 0
    assert not (out / "precious.txt").exists() and (out / "metadata.json").is_file()


def test_pretrain_at_chance_level_warns(tmp_path, capsys):
    """Random pixels carry no class: what pretrain learns is at chance level on 300 test images, and it says so."""
    import json

    make_mnist_layout(tmp_path / "data", "MNIST", n_train=40, n_test=300, compress=False, seed=1)
    assert main(["pretrain", "--dataset", "mnist", "--data-root", str(tmp_path / "data"), "--epochs", "1",
                 "--out", str(tmp_path / "clf")]) == 0
    accuracy = json.loads((tmp_path / "clf" / "metadata.json").read_text())["test_accuracy"]
    assert accuracy < 0.15  # 10 balanced classes: 0.1 expected, standard deviation 0.017 over 300 images
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "after 1 epoch(s)" in warnings[0] and "chance level for 10 classes" in warnings[0]
