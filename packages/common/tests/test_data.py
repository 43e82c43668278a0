import gzip

import numpy as np
import pytest

from rosetta_common.data import (
    Dataset,
    epoch_batches,
    load_prepared,
    prepare,
    read_idx,
    save_prepared,
    write_idx,
)
from rosetta_common.errors import ArtifactError, DataError
from rosetta_common.spec import DataSpec, SpecError


def test_digits_split_is_deterministic_and_well_formed():
    a = prepare(DataSpec(), seed=0)
    b = prepare(DataSpec(), seed=0)
    c = prepare(DataSpec(), seed=1)
    assert a.train_inputs.shape == (1438, 8, 8) and a.test_inputs.shape == (359, 8, 8)
    assert a.train_inputs.dtype == np.float32 and a.train_labels.dtype == np.int64
    assert a.train_inputs.min() >= 0.0 and a.train_inputs.max() <= 1.0
    assert a.num_classes == 10 and a.image_shape == (8, 8)
    np.testing.assert_array_equal(a.test_labels, b.test_labels)
    assert not np.array_equal(a.test_labels, c.test_labels)


def test_prepared_round_trip(tmp_path):
    data = prepare(DataSpec(), seed=0)
    save_prepared(data, tmp_path / "prepared")
    back = load_prepared(tmp_path / "prepared")
    for name in ("train_inputs", "train_labels", "test_inputs", "test_labels"):
        np.testing.assert_array_equal(getattr(back, name), getattr(data, name))
    assert sorted(p.name for p in (tmp_path).iterdir()) == ["prepared"]  # no temporary left behind


def test_epoch_batches_cover_each_sample_at_most_once_and_differ_by_epoch():
    first = epoch_batches(100, 32, seed=0, epoch=0)
    assert [len(b) for b in first] == [32, 32, 32]  # the partial remainder is dropped
    flat = np.concatenate(first)
    assert len(set(flat.tolist())) == len(flat)
    again = epoch_batches(100, 32, seed=0, epoch=0)
    assert all(np.array_equal(x, y) for x, y in zip(first, again, strict=True))
    assert not np.array_equal(np.concatenate(epoch_batches(100, 32, 0, 1)), flat)
    with pytest.raises(SpecError, match=r"train\.batch_size = 200"):
        epoch_batches(100, 200, 0, 0)


def _write_mnist_like(folder, rng, n_train=20, n_test=6, gz=False):
    folder.mkdir()
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 5, 4), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.permutation(np.arange(n_train) % 10).astype(np.uint8),  # every class
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 5, 4), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for name, array in arrays.items():
        write_idx(folder / name, array)
        if gz:
            raw = (folder / name).read_bytes()
            (folder / name).unlink()
            (folder / f"{name}.gz").write_bytes(gzip.compress(raw))
    return arrays


@pytest.mark.parametrize("gz", [False, True])
def test_idx_source_reads_small_files(tmp_path, gz):
    arrays = _write_mnist_like(tmp_path / "mnist", np.random.default_rng(0), gz=gz)
    data = prepare(DataSpec(source="idx", idx_dir="mnist"), seed=0, root=tmp_path)
    assert isinstance(data, Dataset)
    assert data.train_inputs.shape == (20, 5, 4) and data.test_inputs.shape == (6, 5, 4)
    np.testing.assert_allclose(data.train_inputs * 255, arrays["train-images-idx3-ubyte"], atol=1e-4)
    np.testing.assert_array_equal(data.test_labels, arrays["t10k-labels-idx1-ubyte"])


def test_idx_errors_name_the_problem(tmp_path):
    with pytest.raises(SpecError, match=r"data.idx_dir = 'missing': folder not found"):
        prepare(DataSpec(source="idx", idx_dir="missing"), seed=0, root=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError, match="has no train-images-idx3-ubyte"):
        prepare(DataSpec(source="idx", idx_dir="empty"), seed=0, root=tmp_path)
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(DataError, match=r"bad: not an IDX file \(magic number 01020304"):
        read_idx(bad)
    bad.write_bytes(bytes([0, 0, 8, 3, 0, 0]))  # three dimensions announced, one and a half given
    with pytest.raises(DataError, match="announces 3 dimensions but holds 2 header bytes"):
        read_idx(bad)
    bad.with_suffix(".gz").write_bytes(b"not gzip")
    with pytest.raises(DataError, match="not a readable gzip file"):
        read_idx(bad.with_suffix(".gz"))


def test_mnist5k_is_read_from_mlxtends_wheel():
    data = prepare(DataSpec(source="mnist5k"), seed=0)
    assert data.train_inputs.shape == (4000, 28, 28) and data.test_inputs.shape == (1000, 28, 28)
    assert data.num_classes == 10 and data.train_inputs.dtype == np.float32
    assert data.train_inputs.min() >= 0.0 and data.train_inputs.max() == 1.0


def test_idx_labels_that_skip_classes_are_refused(tmp_path):
    arrays = _write_mnist_like(tmp_path / "mnist", np.random.default_rng(1))
    write_idx(tmp_path / "mnist/train-labels-idx1-ubyte", 246 + arrays["train-labels-idx1-ubyte"])
    with pytest.raises(DataError, match=r"train labels span 246\.\.255 but classes \[0, 1, 2, 3, 4\]"):
        prepare(DataSpec(source="idx", idx_dir="mnist"), seed=0, root=tmp_path)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: {**d, "train_inputs": d["train_inputs"].reshape(len(d["train_inputs"]), -1)},
         r"train images: float32 \(1438, 64\), expected float32 \(n, height, width\)"),
        (lambda d: {**d, "train_inputs": d["train_inputs"].astype(np.float64)}, "train images: float64"),
        (lambda d: {**d, "test_inputs": d["test_inputs"] * 16}, r"test images: values in \[0, 16\], expected \[0, 1\]"),
        (lambda d: {**d, "test_inputs": np.full_like(d["test_inputs"], np.nan)}, "non-finite values"),
        (lambda d: {**d, "test_labels": d["test_labels"].astype(np.float32)}, "test labels: float32"),
        (lambda d: {**d, "test_labels": d["test_labels"][:-1]},
         r"test labels: int64 \(358,\), expected int64 \(359,\)"),
        (lambda d: {**d, "test_inputs": d["test_inputs"][:, :4]}, r"test images: \(4, 8\) per image"),
    ],
    ids=["flattened", "float64", "rescaled", "nan", "float_labels", "unpaired_labels", "shape_mismatch"],
)
def test_prepared_files_are_checked_on_load(tmp_path, damage, message):
    data = prepare(DataSpec(), seed=0)
    names = ("train_inputs", "train_labels", "test_inputs", "test_labels")
    arrays = damage({name: getattr(data, name) for name in names})
    (tmp_path / "prepared").mkdir()
    for part in ("train", "test"):
        np.savez(tmp_path / f"prepared/{part}.npz", images=arrays[f"{part}_inputs"], labels=arrays[f"{part}_labels"])
    with pytest.raises(DataError, match=message) as raised:
        load_prepared(tmp_path / "prepared")
    assert "\n" not in str(raised.value) and "prepared" in str(raised.value)


def test_damaged_or_missing_npz_is_one_line(tmp_path):
    save_prepared(prepare(DataSpec(), seed=0), tmp_path / "prepared")
    raw = (tmp_path / "prepared/train.npz").read_bytes()
    (tmp_path / "prepared/train.npz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match=r"train\.npz: not a readable \.npz file"):
        load_prepared(tmp_path / "prepared")
    (tmp_path / "prepared/train.npz").unlink()
    with pytest.raises(ArtifactError, match=r"train\.npz: missing; run the data stage"):
        load_prepared(tmp_path / "prepared")
