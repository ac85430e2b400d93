"""Dataset readers: the embedded data, and the torchvision on-disk formats with fixtures written in those formats."""
from __future__ import annotations

import gzip
import os
import pickle
import struct

import numpy as np
import pytest

from training.datasets import load_dataset, read_idx
from transdenoiser.errors import UserError


def write_idx(path, array: np.ndarray, compress: bool) -> None:
    """Write ``array`` (uint8) in the IDX format of LeCun's MNIST files."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    if compress:
        data = gzip.compress(data)
        path = path.with_name(path.name + ".gz")
    path.write_bytes(data)


def make_mnist_layout(root, folder: str, n_train: int, n_test: int, compress: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images, compress)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels, compress)
        arrays[prefix] = (images, labels)
    return arrays


def make_cifar_layout(root, n_per_batch: int, seed: int = 0):
    """Batches as the 'CIFAR-10 python version' ships them: pickled dicts, uint8 data (N, 3072), list labels."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(n_per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=n_per_batch)]
        batch = {"batch_label": f"{name} of 5", "labels": labels, "data": data,
                 "filenames": [f"img_{i}.png" for i in range(n_per_batch)]}
        with open(folder / name, "wb") as handle:
            pickle.dump(batch, handle, protocol=2)
        batches[name] = (data, labels)
    with open(folder / "batches.meta", "wb") as handle:
        pickle.dump({"label_names": ["airplane"] * 10, "num_cases_per_batch": n_per_batch}, handle, protocol=2)
    return batches


def test_mnist10k_splits_are_disjoint_balanced_and_add_up(mnist10k):
    sizes = [len(mnist10k.split(s)) for s in ("public", "private", "test")]
    assert sum(sizes) == 10_000
    assert sizes == [4998, 2998, 2004]
    assert mnist10k.image_shape == (1, 28, 28)
    # disjoint: no image row appears in two splits (pixels + label as the key)
    keys = [{(img.tobytes(), int(lbl)) for img, lbl in zip(s.images, s.labels, strict=True)}
            for s in (mnist10k.public, mnist10k.private, mnist10k.test)]
    assert not (keys[0] & keys[1]) and not (keys[0] & keys[2]) and not (keys[1] & keys[2])
    for split in (mnist10k.public, mnist10k.private, mnist10k.test):
        counts = np.bincount(split.labels, minlength=10)
        assert counts.min() > 0.7 * counts.max()  # stratified, every class present in proportion


def test_split_is_deterministic_and_seed_dependent(mnist10k):
    again = load_dataset("mnist10k")
    assert again.fingerprints() == mnist10k.fingerprints()
    other = load_dataset("mnist10k", split_seed=1)
    assert other.fingerprints()["test"] != mnist10k.fingerprints()["test"]


def test_tensors_are_unit_interval(mnist10k):
    x, y = mnist10k.test.tensors()
    assert x.dtype.is_floating_point and float(x.min()) >= 0.0 and float(x.max()) <= 1.0
    assert float(x.max()) == 1.0 and y.max().item() == 9


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("name,folder", [("mnist", "MNIST"), ("fashion-mnist", "FashionMNIST")])
def test_idx_layout_reads_exact_pixels(tmp_path, name, folder, compress):
    arrays = make_mnist_layout(tmp_path, folder, n_train=60, n_test=20, compress=compress)
    ds = load_dataset(name, tmp_path)
    assert len(ds.public) + len(ds.private) == 60 and len(ds.test) == 20
    np.testing.assert_array_equal(ds.test.images[:, 0], arrays["t10k"][0])
    np.testing.assert_array_equal(ds.test.labels, arrays["t10k"][1])
    train_keys = {img.tobytes() for img in arrays["train"][0]}
    assert all(img[0].tobytes() in train_keys for img in ds.private.images)


def test_idx_errors_name_the_problem(tmp_path):
    make_mnist_layout(tmp_path, "MNIST", 30, 10, compress=False)
    raw = tmp_path / "MNIST" / "raw"
    os.remove(raw / "t10k-labels-idx1-ubyte")
    with pytest.raises(UserError, match="t10k-labels-idx1-ubyte"):
        load_dataset("mnist", tmp_path)
    bad = raw / "broken-idx3-ubyte"
    bad.write_bytes(bytes([0, 0, 8, 3]) + struct.pack(">III", 5, 28, 28) + b"\x00" * 100)
    with pytest.raises(UserError, match="announces"):
        read_idx(bad)
    bad.write_bytes(b"not an idx file")
    with pytest.raises(UserError, match="magic"):
        read_idx(bad)


def test_cifar10_layout(tmp_path):
    batches = make_cifar_layout(tmp_path, n_per_batch=12)
    ds = load_dataset("cifar10", tmp_path)
    assert ds.image_shape == (3, 32, 32) and len(ds.test) == 12 and len(ds.public) + len(ds.private) == 60
    data, labels = batches["test_batch"]
    np.testing.assert_array_equal(ds.test.images.reshape(12, -1), data)
    np.testing.assert_array_equal(ds.test.labels, labels)
    assert ds.classes[0] == "airplane" and ds.num_classes == 10


def test_cifar10_refuses_code_in_pickles(tmp_path):
    make_cifar_layout(tmp_path, n_per_batch=4)

    class Exploit:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as handle:
        pickle.dump({"data": Exploit(), "labels": []}, handle, protocol=2)
    with pytest.raises(UserError, match="refusing to load"):
        load_dataset("cifar10", tmp_path)


def test_cifar10_missing_files(tmp_path):
    with pytest.raises(UserError, match="data_batch_1"):
        load_dataset("cifar10", tmp_path)


def test_imagefolder(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(10):
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(tmp_path / cls / f"{i}.png")
    ds = load_dataset("imagefolder", tmp_path)
    assert ds.classes == ("cat", "dog") and ds.image_shape == (3, 16, 16)
    assert len(ds.public) + len(ds.private) + len(ds.test) == 20
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(tmp_path / "dog" / "small.png")
    with pytest.raises(UserError, match="different sizes"):
        load_dataset("imagefolder", tmp_path)
    (tmp_path / "dog" / "small.png").write_bytes(b"garbage")
    with pytest.raises(UserError, match="cannot decode"):
        load_dataset("imagefolder", tmp_path)


def test_unknown_dataset_and_missing_root(tmp_path):
    with pytest.raises(UserError, match="unknown dataset"):
        load_dataset("svhn")
    with pytest.raises(UserError, match="no such directory"):
        load_dataset("mnist", tmp_path / "nope")
