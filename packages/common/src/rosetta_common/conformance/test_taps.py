"""taps.py of the contract: every tap of every architecture, in the canonical names, order, shapes and layouts,
against the float64 reference's taps; and a planted weight-mapping mistake is localized to the tap where it enters.

The mistakes planted here are the ones a package's weights.py can make (gate order, a bias mapping, a dense
kernel transposed): the package is given the weights such a mapping would load, the reference the right ones.
Mistakes in a framework's model code are planted in that framework's own tests/test_taps.py."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest

from rosetta_common.metrics import max_abs_diff
from rosetta_common.reference import forward_with_taps
from rosetta_common.spec import ModelConfig, Spec
from rosetta_common.taps import first_divergent, taps
from rosetta_common.testing import assert_localized, asymmetric_weights, random_inputs, small_config, swap_blocks
from rosetta_common.weights import Weights

TOLERANCES = Spec().tolerances
# Every tap, as the logits: the bound the forward check (test_models.py) applies against the reference.
TAP_ABS = TOLERANCES.forward_parity_abs
NON_SQUARE = (6, 10)  # height != width: a swapped axis or an assumed square image cannot pass
BATCH = 3


def _images(config: ModelConfig, seed: int = 30) -> np.ndarray:
    """A batch of what `config` reads: NON_SQUARE images, or padded token ids of the maximum length."""
    if config.input.kind == "tokens":
        return random_inputs(config, BATCH, seed)
    return np.random.default_rng(seed).random((BATCH, *NON_SQUARE), dtype=np.float32)


def _figures(diffs: dict) -> str:
    return "; ".join(f"{name}: {d.max_abs:.2e} abs, {d.rel:.1e} rel" for name, d in diffs.items())


def test_taps_have_the_canonical_names_order_shapes_and_dtype(backend: ModuleType, arch: str) -> None:
    config = small_config(arch, NON_SQUARE)
    got = backend.forward_with_taps(backend.build(config, asymmetric_weights(config, 31)), _images(config))
    expected = taps(config, BATCH)
    assert list(got) == [tap.name for tap in expected]
    for tap in expected:
        assert got[tap.name].shape == tap.shape, (tap.name, got[tap.name].shape, tap.layout)
        assert got[tap.name].dtype == np.float32, tap.name


def test_every_tap_matches_the_float64_reference(backend: ModuleType, arch: str) -> None:
    config = small_config(arch, NON_SQUARE)
    weights = asymmetric_weights(config, 32)
    images = _images(config)
    got = backend.forward_with_taps(backend.build(config, weights), images)
    first, diffs = first_divergent(got, forward_with_taps(config, weights, images), TAP_ABS)
    assert first is None, f"first divergent tap {first}: {_figures(diffs)}"


def test_the_logits_tap_is_predict_and_the_model_is_untouched(backend: ModuleType, arch: str) -> None:
    """The taps come from the model's own forward: its logits are predict's (within the bound for the same model
    run another way, a native reload), and reading them changes neither the weights nor predict's output."""
    config = small_config(arch, NON_SQUARE)
    model = backend.build(config, asymmetric_weights(config, 33))
    images = _images(config)
    before, weights_before = backend.predict(model, images), backend.to_canonical(model)
    logits = backend.forward_with_taps(model, images)["logits"]
    bound = TOLERANCES.native_roundtrip_abs + TOLERANCES.native_roundtrip_rel * float(np.abs(before).max())
    assert max_abs_diff(logits, before) <= bound
    np.testing.assert_array_equal(backend.predict(model, images), before)
    for name, value in backend.to_canonical(model).items():
        np.testing.assert_array_equal(value, weights_before[name], err_msg=name)


def _transposed(name: str) -> Callable[[Weights], None]:
    def plant(w: Weights) -> None:
        w[name] = np.ascontiguousarray(w[name].T)  # a square (embed, embed) kernel: the shape check passes
    return plant


def _gate_order(arch: str) -> Callable[[Weights], None]:
    def plant(w: Weights) -> None:  # LSTM i <-> f, GRU r <-> z, in every tensor of the layer
        for name in [n for n in w if n.startswith(f"{arch}.")]:
            w[name] = swap_blocks(w[name], 4 if arch == "lstm" else 3, 0, 1)
    return plant


def _lstm_bias_twice(w: Weights) -> None:  # torch's bias_ih and bias_hh both given the canonical bias
    w["lstm.bias"] = 2 * w["lstm.bias"]


def _gru_bias_sides_swapped(w: Weights) -> None:  # the input and the recurrent bias exchanged
    w["gru.input_bias"], w["gru.recurrent_bias"] = w["gru.recurrent_bias"], w["gru.input_bias"]


# (architecture, mistake, the tap where it enters, the mis-mapped weights it loads)
PLANTED = [
    ("lstm", "gate_order", "lstm.cell", _gate_order("lstm")),
    ("gru", "gate_order", "gru.hidden", _gate_order("gru")),
    ("lstm", "bias_counted_twice", "lstm.cell", _lstm_bias_twice),
    ("gru", "bias_sides_swapped", "gru.hidden", _gru_bias_sides_swapped),
    ("attention", "query_kernel_transposed", "block.attn.query", _transposed("block.attn.query.kernel")),
    ("attention", "out_kernel_transposed", "block.attn.out", _transposed("block.attn.out.kernel")),
]


@pytest.mark.parametrize(("arch_name", "mistake", "enters", "plant"), PLANTED,
                         ids=[f"{a}-{m}" for a, m, _, _ in PLANTED])
def test_a_planted_mapping_mistake_is_localized_where_it_enters(backend: ModuleType, arch_name: str, mistake: str,
                                                                enters: str, plant: Callable[[Weights], None]) -> None:
    """What a weights.py that made `mistake` would load: the package's taps agree with the reference's up to
    the tap where the mistake enters, and miss by far there."""
    config = small_config(arch_name, NON_SQUARE)
    weights = asymmetric_weights(config, 34)
    wrong = {name: value.copy() for name, value in weights.items()}
    plant(wrong)
    images = _images(config)
    got = backend.forward_with_taps(backend.build(config, wrong), images)
    assert_localized(got, forward_with_taps(config, weights, images), enters, TAP_ABS)
