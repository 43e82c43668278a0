import numpy as np
import pytest

from rosetta_common.reference import forward, max_pool2x2
from rosetta_common.spec import Spec, parse_spec
from rosetta_common.weights import (
    LAYOUT,
    canonical_shapes,
    check_weights,
    init_weights,
    load_weights,
    random_weights,
    read_metadata,
    save_weights,
)

SMALL = parse_spec({"architecture": {"attention": {"embed_dim": 16, "num_heads": 4, "mlp_dim": 24}}})


@pytest.mark.parametrize("arch", ["mlp", "cnn", "attention"])
def test_init_is_deterministic_and_matches_canonical_shapes(arch):
    shapes = canonical_shapes(arch, Spec(), (8, 8), 10)
    a = init_weights(arch, Spec(), (8, 8), 10, seed=0)
    b = init_weights(arch, Spec(), (8, 8), 10, seed=0)
    c = init_weights(arch, Spec(), (8, 8), 10, seed=1)
    check_weights(a, shapes)
    assert list(a) == list(shapes)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert any(not np.array_equal(a[k], c[k]) for k in a if k.endswith(".kernel"))
    assert all(v.dtype == np.float32 for v in a.values())


def test_canonical_layout_conventions():
    shapes = canonical_shapes("cnn", Spec(), (8, 8), 10)
    assert shapes["conv1.kernel"] == (3, 3, 1, 32)  # HWIO
    assert shapes["conv2.kernel"] == (3, 3, 32, 64)
    assert shapes["head.kernel"] == (4 * 4 * 64, 10)  # (h, w, c) flatten after one 2x2 pool
    assert canonical_shapes("mlp", Spec(), (8, 8), 10)["hidden.kernel"] == (64, 256)  # (in, out)


def test_safetensors_round_trip_and_metadata(tmp_path):
    w = random_weights(canonical_shapes("attention", SMALL, (8, 8), 10), seed=3)
    save_weights(tmp_path / "w.safetensors", w, "attention", seed="3")
    back = load_weights(tmp_path / "w.safetensors")
    assert all(np.array_equal(back[k], w[k]) for k in w)
    assert read_metadata(tmp_path / "w.safetensors") == {"architecture": "attention", "layout": LAYOUT, "seed": "3"}


def test_check_weights_names_the_problem():
    shapes = canonical_shapes("mlp", Spec(), (8, 8), 10)
    w = init_weights("mlp", Spec(), (8, 8), 10, 0)
    with pytest.raises(ValueError, match="missing"):
        check_weights({k: v for k, v in w.items() if k != "head.bias"}, shapes)
    w["hidden.kernel"] = w["hidden.kernel"].T
    with pytest.raises(ValueError, match=r"hidden.kernel has shape \(256, 64\)"):
        check_weights(w, shapes)


def test_reference_forward_pieces():
    x = np.arange(2 * 4 * 5 * 3, dtype=np.float64).reshape(2, 4, 5, 3)
    pooled = max_pool2x2(x)
    assert pooled.shape == (2, 2, 2, 3)
    assert pooled[0, 0, 0, 0] == x[0, :2, :2, 0].max()
    images = np.random.default_rng(0).random((3, 8, 8), dtype=np.float32)
    for arch in ("mlp", "cnn", "attention"):
        w = random_weights(canonical_shapes(arch, SMALL, (8, 8), 10), seed=1)
        logits = forward(arch, SMALL, w, images)
        assert logits.shape == (3, 10) and np.isfinite(logits).all()
        # batch independence: each row depends only on its own image
        np.testing.assert_allclose(forward(arch, SMALL, w, images[1:2]), logits[1:2], rtol=0, atol=1e-12)
