import json
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

from rosetta_common.errors import ArtifactError, WeightsError
from rosetta_common.reference import forward, max_pool2x2
from rosetta_common.spec import ARCHITECTURES, TOKEN_ARCHITECTURES, ModelConfig, Spec, parse_spec
from rosetta_common.weights import (
    LAYOUT,
    canonical_shapes,
    check_weights,
    init_weights,
    is_statistic,
    load_weights,
    perturbed,
    random_weights,
    read_metadata,
    save_weights,
)

SMALL = parse_spec({"architecture": {"attention": {"embed_dim": 16, "num_heads": 4, "mlp_dim": 24}}})


def config(arch: str, spec: Spec = SMALL, shape: tuple[int, int] = (8, 8)) -> ModelConfig:
    if arch in TOKEN_ARCHITECTURES:  # a vocabulary of 50 ids, 12 positions
        return ModelConfig.of_tokens(spec, arch, 50, 12, 10)
    return ModelConfig.of(spec, arch, shape, 10)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_init_is_deterministic_and_matches_canonical_shapes(arch):
    c = config(arch, Spec())
    a, b, other = init_weights(c, seed=0), init_weights(c, seed=0), init_weights(c, seed=1)
    check_weights(a, c)
    assert list(a) == list(canonical_shapes(c))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert any(not np.array_equal(a[k], other[k]) for k in a if k.endswith(".kernel"))
    assert all(v.dtype == np.float32 for v in a.values())


def test_canonical_layout_conventions():
    shapes = canonical_shapes(config("cnn", Spec()))
    assert shapes["conv1.kernel"] == (3, 3, 1, 32)  # HWIO
    assert shapes["conv2.kernel"] == (3, 3, 32, 64)
    assert shapes["head.kernel"] == (4 * 4 * 64, 10)  # (h, w, c) flatten after one 2x2 pool
    assert canonical_shapes(config("mlp", Spec()))["hidden.kernel"] == (64, 256)  # (in, out)
    assert canonical_shapes(config("attention", Spec(), (6, 10)))["pos_embedding"] == (6, 512)  # height tokens


def test_model_config_is_validated_hashable_and_json():
    c = config("attention")
    assert hash(c) == hash(config("attention"))
    assert ModelConfig.model_validate_json(c.model_dump_json()) == c
    with pytest.raises(ValueError, match="hidden"):
        ModelConfig.model_validate({"arch": "cnn", "image_shape": [8, 8], "num_classes": 10, "settings": {"hidden": 3}})


def test_safetensors_round_trip_and_metadata(tmp_path):
    c = config("attention")
    w = random_weights(canonical_shapes(c), seed=3)
    save_weights(tmp_path / "w.safetensors", w, "attention", seed="3")
    back = load_weights(tmp_path / "w.safetensors", c)
    assert all(np.array_equal(back[k], w[k]) for k in w)
    assert read_metadata(tmp_path / "w.safetensors") == {"architecture": "attention", "layout": LAYOUT, "seed": "3"}


def test_weights_files_are_byte_identical_across_processes(tmp_path):
    """safetensors keeps metadata in a hash map: several keys came out in a different order per process."""
    script = (
        "import sys, numpy as np; from rosetta_common.weights import save_weights;"
        "save_weights(sys.argv[1], {'a.kernel': np.ones((2, 3), np.float32)}, 'mlp', seed='0', framework='torch')"
    )
    files = [tmp_path / f"{i}.safetensors" for i in range(4)]
    for f in files:
        subprocess.run([sys.executable, "-c", script, str(f)], check=True, env={"PYTHONPATH": ":".join(sys.path)})
    assert len({f.read_bytes() for f in files}) == 1


def test_bad_weights_files_are_one_line_errors(tmp_path):
    c = config("mlp")
    w = random_weights(canonical_shapes(c), seed=1)
    save_file(w, str(tmp_path / "tag.safetensors"), metadata={"rosetta": json.dumps({"layout": "other-v0"})})
    with pytest.raises(WeightsError, match="layout tag 'other-v0'"):
        load_weights(tmp_path / "tag.safetensors", c)
    save_weights(tmp_path / "cnn.safetensors", w, "cnn")
    with pytest.raises(WeightsError, match="architecture 'cnn', expected 'mlp'"):
        load_weights(tmp_path / "cnn.safetensors", c)
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ArtifactError, match=r"junk\.safetensors: not a readable safetensors file"):
        load_weights(tmp_path / "junk.safetensors", c)
    with pytest.raises(ArtifactError, match="missing"):
        load_weights(tmp_path / "absent.safetensors", c)


def test_check_weights_names_the_problem():
    c = config("mlp", Spec())
    w = init_weights(c, 0)
    with pytest.raises(WeightsError, match=r"missing \['head.bias'\]"):
        check_weights({k: v for k, v in w.items() if k != "head.bias"}, c)
    with pytest.raises(WeightsError, match="dtype float64"):
        check_weights({**w, "head.bias": w["head.bias"].astype(np.float64)}, c)
    with pytest.raises(WeightsError, match=r"head\.bias holds 1 non-finite"):
        check_weights({**w, "head.bias": np.array([np.inf, *w["head.bias"][1:]], np.float32)}, c)
    w["hidden.kernel"] = w["hidden.kernel"].T
    with pytest.raises(WeightsError, match=r"hidden.kernel has shape \(256, 64\)"):
        check_weights(w, c)


def test_reference_forward_pieces():
    x = np.arange(2 * 4 * 5 * 3, dtype=np.float64).reshape(2, 4, 5, 3)
    pooled = max_pool2x2(x)
    assert pooled.shape == (2, 2, 2, 3)
    assert pooled[0, 0, 0, 0] == x[0, :2, :2, 0].max()
    images = np.random.default_rng(0).random((3, 8, 8), dtype=np.float32)
    tokens = np.array([[3, 9, 0, 0], [7, 0, 0, 0], [4, 4, 2, 8]])  # padded, one row without padding
    for arch in ARCHITECTURES:
        c = config(arch)
        w = random_weights(canonical_shapes(c), seed=1)
        images = tokens if arch in TOKEN_ARCHITECTURES else images
        logits = forward(c, w, images)
        assert logits.shape == (3, 10) and np.isfinite(logits).all()
        # batch independence: each row depends only on its own image
        np.testing.assert_allclose(forward(c, w, images[1:2]), logits[1:2], rtol=0, atol=1e-12)


@pytest.mark.parametrize(("arch", "ulps"), [("cnn", 1), ("resnet", 1), ("cnn", 16)])
def test_a_replicate_moves_every_nonzero_trainable_weight_by_its_ulps(arch: str, ulps: int) -> None:
    """The null's replicates (params.yaml replicates): every nonzero trainable element `ulps` float32 steps away (one
    for the lockstep window's, replicates.ulps for the end-of-training ones), in both directions, exact zeros and
    statistics untouched (a zero's neighbours are denormals, which TF and XLA flush and torch keeps); the same for
    the same replicate, other signs for another, the same signs whatever the distance."""
    init = init_weights(config(arch), seed=0)
    first, moved = perturbed(init, 1, ulps)
    again, _ = perturbed(init, 1, ulps)
    second, _ = perturbed(init, 2, ulps)
    one, _ = perturbed(init, 1)
    assert moved.startswith(f"every nonzero trainable weight +- {ulps} ulp")
    for name, value in init.items():
        if is_statistic(name):
            assert np.array_equal(first[name], value), name
            continue
        steps = np.abs(first[name].view(np.int32).astype(np.int64) - value.view(np.int32).astype(np.int64))
        zero = value == 0
        assert (steps[~zero] == ulps).all() and (steps[zero] == 0).all(), name
        assert np.array_equal(np.sign(first[name] - value), np.sign(one[name] - value)), name
        assert first[name].dtype == value.dtype and np.array_equal(first[name], again[name]), name
        if zero.all():
            continue  # a zero-initialised bias: nothing to move
        up = first[name][~zero] > value[~zero]
        assert 0 < up.mean() < 1 or up.size == 1, f"{name}: one direction only"
        assert not np.array_equal(first[name], second[name]) or up.size == 1, name
    with pytest.raises(ValueError):
        perturbed(init, 0)
    with pytest.raises(ValueError):
        perturbed(init, 1, 0)


def test_each_null_group_draws_its_own_signs() -> None:
    """The end-of-training replicates' groups ("torch", "tf", ...) move replicate i each its own way, the same way
    every time; without a group (the lockstep window's) replicate i moves alike in every framework."""
    init = init_weights(config("cnn"), seed=0)
    name = next(n for n, v in init.items() if not is_statistic(n) and (v != 0).sum() > 100)
    signs = {group: np.sign(perturbed(init, 1, 16, group)[0][name] - init[name]) for group in ("torch", "tf", "")}
    assert np.array_equal(signs["torch"], np.sign(perturbed(init, 1, 16, "torch")[0][name] - init[name]))
    assert not np.array_equal(signs["torch"], signs["tf"])
    assert np.array_equal(signs[""], np.sign(perturbed(init, 1, 16)[0][name] - init[name]))
    assert "derive_seed(1, 'torch')" in perturbed(init, 1, 16, "torch")[1]
