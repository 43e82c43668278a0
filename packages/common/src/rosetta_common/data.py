"""The data module: one prepared split, one batch order, the same for every framework.

Sources: scikit-learn's handwritten digits (1,797 real 8x8 images shipped inside the package, no download)
or MNIST-format IDX files from a local folder. Prepared data is images float32 in [0, 1] shaped
(n, height, width) and int64 labels, in `train.npz` and `test.npz`.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rosetta_common.io import atomic_path
from rosetta_common.seeding import derive_seed
from rosetta_common.spec import DataSpec, SpecError

IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_IDX_DTYPES = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


@dataclass(frozen=True)
class Dataset:
    train_images: np.ndarray  # (n, h, w) float32 in [0, 1]
    train_labels: np.ndarray  # (n,) int64
    test_images: np.ndarray
    test_labels: np.ndarray

    @property
    def image_shape(self) -> tuple[int, int]:
        return tuple(self.train_images.shape[1:])  # type: ignore[return-value]

    @property
    def num_classes(self) -> int:
        return int(max(self.train_labels.max(), self.test_labels.max())) + 1

    def validation_batch(self, size: int) -> np.ndarray:
        """The fixed batch on which every exported model's logits are compared: the first test images."""
        return self.test_images[:size]


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (MNIST's format), plain or gzip-compressed."""
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic number)")
    dtype, ndim = np.dtype(_IDX_DTYPES[raw[2]]), raw[3]
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    body = raw[4 + 4 * ndim :]
    if len(body) != int(np.prod(shape)) * dtype.itemsize:
        raise ValueError(f"{path}: IDX header says shape {shape} but the file holds {len(body)} bytes of data")
    return np.frombuffer(body, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write an array as an IDX file (uint8 only); used by tests and by users converting their data."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    Path(path).write_bytes(header + array.tobytes())


def _find_idx(folder: Path, stem: str, shown: str) -> Path:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (folder / name).is_file():
            return folder / name
    raise SpecError(f"params.yaml: data.idx_dir = {shown!r}: has no {stem} (or {stem}.gz)")


def load_idx_folder(folder: Path, max_pixel: float | None, shown: str | None = None) -> Dataset:
    """Read the four MNIST-format files from `folder` (`shown` is how params.yaml names it)."""
    shown = shown or str(folder)
    if not folder.is_dir():
        raise SpecError(f"params.yaml: data.idx_dir = {shown!r}: folder not found")
    arrays = {key: read_idx(_find_idx(folder, stem, shown)) for key, stem in IDX_FILES.items()}
    scale = np.float32(max_pixel or 255.0)
    for part in ("train", "test"):
        images, labels = arrays[f"{part}_images"], arrays[f"{part}_labels"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise ValueError(f"{folder}: {part} images {images.shape} and labels {labels.shape} do not pair up")
    return Dataset(
        train_images=(arrays["train_images"].astype(np.float32) / scale),
        train_labels=arrays["train_labels"].astype(np.int64),
        test_images=(arrays["test_images"].astype(np.float32) / scale),
        test_labels=arrays["test_labels"].astype(np.int64),
    )


def load_digits_split(test_fraction: float, seed: int, max_pixel: float | None) -> Dataset:
    """scikit-learn's digits, split by a permutation drawn from the seed."""
    from sklearn.datasets import load_digits  # only the data stage needs scikit-learn

    digits = load_digits()
    images = (digits.images / np.float32(max_pixel or 16.0)).astype(np.float32)
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(derive_seed(seed, "split")).permutation(len(labels))
    n_test = round(len(labels) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return Dataset(images[train], labels[train], images[test], labels[test])


def prepare(spec: DataSpec, seed: int, root: Path = Path()) -> Dataset:
    if spec.source == "digits":
        data = load_digits_split(spec.test_fraction, seed, spec.max_pixel)
    else:
        data = load_idx_folder(root / str(spec.idx_dir), spec.max_pixel, shown=spec.idx_dir)
    for name in ("train_images", "test_images"):
        values = getattr(data, name)
        if values.min() < 0 or values.max() > 1:
            raise SpecError(f"params.yaml: data.max_pixel = {spec.max_pixel}: {name} fall outside [0, 1] after scaling")
    return data


def save_prepared(data: Dataset, folder: str | Path) -> None:
    folder = Path(folder)
    with atomic_path(folder) as tmp:
        tmp.mkdir()
        np.savez(tmp / "train.npz", images=data.train_images, labels=data.train_labels)
        np.savez(tmp / "test.npz", images=data.test_images, labels=data.test_labels)


def load_prepared(folder: str | Path = "data/prepared") -> Dataset:
    folder = Path(folder)
    parts = {}
    for part in ("train", "test"):
        with np.load(folder / f"{part}.npz", allow_pickle=False) as f:
            parts[part] = (f["images"].astype(np.float32), f["labels"].astype(np.int64))
    return Dataset(*parts["train"], *parts["test"])


def epoch_batches(num_samples: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Index batches of one epoch: a permutation drawn from (seed, epoch), last partial batch dropped.

    Every framework trains on exactly these batches in exactly this order; dropping the remainder keeps
    one batch shape, so JAX and TF compile their step once.
    """
    if batch_size > num_samples:
        raise SpecError(
            f"params.yaml: train.batch_size = {batch_size}: must not exceed the {num_samples} training images"
        )
    order = np.random.default_rng(derive_seed(seed, "shuffle", str(epoch))).permutation(num_samples)
    steps = num_samples // batch_size
    return [order[i * batch_size : (i + 1) * batch_size] for i in range(steps)]


def iterate_batches(data: Dataset, batch_size: int, seed: int, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for idx in epoch_batches(len(data.train_labels), batch_size, seed, epoch):
        yield data.train_images[idx], data.train_labels[idx]
