"""JAX specifics of the native export: the jax.export module's symbolic batch, the files and config.json,
and damaged files named in one-line ArtifactErrors."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

import rosetta_jax
from rosetta_common.errors import ArtifactError
from rosetta_common.spec import ModelConfig, Spec
from rosetta_common.testing import asymmetric_weights, small_config
from rosetta_jax.export import CONFIG_FILE, EXPORT_FILE, PARAMS_FILE

NATIVE_ABS = Spec().tolerances.native_roundtrip_abs
IMAGE_SHAPE = (6, 10)  # not square: the export's static dimensions must be (height, width), in that order


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    config = small_config("cnn", IMAGE_SHAPE)
    model = rosetta_jax.build(config, asymmetric_weights(config, 1))
    out = tmp_path_factory.mktemp("cnn") / "native"
    example = np.zeros((2, *IMAGE_SHAPE), np.float32)
    files = rosetta_jax.export_native(model, out, example)
    assert sorted(f.name for f in files) == sorted(p.name for p in out.iterdir())
    return model, out


def test_files_and_config_json(exported: tuple[object, Path]) -> None:
    model, out = exported
    assert sorted(p.name for p in out.iterdir()) == sorted([CONFIG_FILE, PARAMS_FILE, EXPORT_FILE])
    assert ModelConfig.model_validate_json((out / CONFIG_FILE).read_text()) == rosetta_jax.model_config(model)


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_jax_export_has_a_symbolic_batch(exported: tuple[object, Path], batch: int) -> None:
    model, out = exported
    module = jax.export.deserialize(bytearray((out / EXPORT_FILE).read_bytes()))
    first, *rest = module.in_avals[0].shape
    assert not isinstance(first, int) and tuple(rest) == IMAGE_SHAPE  # one module serves every batch size
    images = np.random.default_rng(batch).random((batch, *IMAGE_SHAPE), dtype=np.float32)
    got = rosetta_jax.load_native(out)["jax_export"](images)
    assert got.shape == (batch, 10)
    assert np.abs(got - rosetta_jax.predict(model, images)).max() <= NATIVE_ABS


@pytest.mark.parametrize("name", [CONFIG_FILE, PARAMS_FILE, EXPORT_FILE])
@pytest.mark.parametrize("damage", ["missing", "truncated", "garbage"])
def test_a_damaged_file_is_a_one_line_artifact_error(exported: tuple[object, Path], tmp_path: Path, name: str,
                                                      damage: str) -> None:
    _, out = exported
    copy = tmp_path / "native"
    copy.mkdir()
    for path in out.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    target = copy / name
    if damage == "missing":
        target.unlink()
    elif damage == "truncated":
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    else:
        target.write_bytes(b"\x01 not a Rosetta export")
    with pytest.raises(ArtifactError) as raised:
        rosetta_jax.load_native(copy)
    message = str(raised.value)
    assert "\n" not in message and name in message, message
