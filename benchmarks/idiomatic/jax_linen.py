"""JAX's second idiomatic loop, the style of most JAX code in the wild: `flax.linen` modules, `optax.adam`, a
`flax.training.train_state.TrainState`, one `@jax.jit def train_step(state, batch)` over numpy batches sliced per
step (as Flax's linen MNIST example writes it: a numpy permutation per epoch, the last partial batch dropped).

Our JAX models are NNX modules, but most JAX code is linen, so our train() is held to this loop as well as to the
NNX one (idiomatic/jax.py). The mlp and the attention model only (MODELS), written as a Flax user writes them, with
Flax's own layers at their defaults, equal in shapes to rosetta_jax.models' and started from the very weights our
build() returns: both loops train the same model from the same start, and only the speed is compared (the losses
are a sanity figure). PARITY adds to this loop, one at a time, what parity makes our train() do: torch's Adam, the
two-pass LayerNorm, the exact (erf) GELU, the attention written out with einsum. TRICKS: none (the NNX loop's
`donate` is measured in idiomatic/jax.py). Latest figures and what each requirement costs: benchmarks/README.md.
"""

from __future__ import annotations

import math
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from flax.training import train_state

from benchmarks.idiomatic import LoopRun
from rosetta_common.data import Dataset
from rosetta_common.spec import AdamSpec, SGDSpec

MODELS = ("mlp", "attention")  # the architectures this loop has a linen twin of
TRICKS: dict[str, str] = {}
PARITY = {
    "torch_adam": "rosetta_jax's torch_adam instead of optax.adam (torch's bias corrections from a float64-computed "
                  "table, looked up per step)",
    "two_pass_layernorm": "attention: nn.LayerNorm(use_fast_variance=False), the biased two-pass variance the spec "
                          "(torch) computes, instead of Flax's one-pass E[x^2] - E[x]^2",
    "erf_gelu": "attention: nn.gelu(approximate=False), the spec's exact GELU, instead of Flax's tanh approximation",
    "einsum_attention": "attention: the attention written out as rosetta_jax.models.SelfAttention writes it "
                        "(nn.Dense q/k/v without bias, out with bias; scores scaled after q.k) instead of "
                        "nn.MultiHeadDotProductAttention",
    "parity_model": "attention: all three model changes at once (two_pass_layernorm, erf_gelu, einsum_attention): "
                    "the spec's model in linen",
}
ONLY_FOR = {name: ("attention",) for name in ("two_pass_layernorm", "erf_gelu", "einsum_attention", "parity_model")}
MODEL_PARITY = {"two_pass_layernorm", "erf_gelu", "einsum_attention"}


class MLP(nn.Module):
    hidden: int
    num_classes: int

    @nn.compact
    def __call__(self, images: jax.Array) -> jax.Array:
        x = images.reshape(images.shape[0], -1)
        x = nn.relu(nn.Dense(self.hidden, name="hidden")(x))
        return nn.Dense(self.num_classes, name="head")(x)


class SelfAttention(nn.Module):
    """rosetta_jax.models.SelfAttention in linen (the einsum_attention parity variant)."""

    num_heads: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        batch, tokens, embed = x.shape
        head_dim = embed // self.num_heads

        def split(t: jax.Array) -> jax.Array:
            return t.reshape(batch, tokens, self.num_heads, head_dim)

        q = split(nn.Dense(embed, use_bias=False, name="query")(x))
        k = split(nn.Dense(embed, use_bias=False, name="key")(x))
        v = split(nn.Dense(embed, use_bias=False, name="value")(x))
        weights = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim), axis=-1)
        return nn.Dense(embed, name="out")(jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, tokens, embed))


# The attention model as a linen user writes it, equal in shapes to rosetta_jax.models.AttentionClassifier: embed +
# learned positions, one pre-norm encoder block, a final LayerNorm, the mean over tokens, a dense head. At Flax's
# defaults (PARITY's model changes off): nn.LayerNorm's one-pass "fast" variance (the spec's epsilon, part of the
# architecture), nn.gelu's tanh approximation, and nn.MultiHeadDotProductAttention, Flax's own layer, with
# use_bias=False (the canonical q/k/v projections have no bias; its out projection then has none either, 512 adds
# per token fewer than ours).
class AttentionClassifier(nn.Module):
    embed_dim: int
    num_heads: int
    mlp_dim: int
    eps: float
    num_classes: int
    parity: frozenset[str] = frozenset()  # PARITY's model changes in force

    @nn.compact
    def __call__(self, images: jax.Array) -> jax.Array:
        fast = "two_pass_layernorm" not in self.parity
        x = nn.Dense(self.embed_dim, name="embed")(images)
        x = x + self.param("pos_embedding", nn.initializers.zeros, (images.shape[1], self.embed_dim))
        y = nn.LayerNorm(epsilon=self.eps, use_fast_variance=fast, name="norm1")(x)
        if "einsum_attention" in self.parity:
            y = SelfAttention(self.num_heads, name="attn")(y)
        else:
            y = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, qkv_features=self.embed_dim,
                                                out_features=self.embed_dim, use_bias=False, name="attn")(y)
        x = x + y
        y = nn.LayerNorm(epsilon=self.eps, use_fast_variance=fast, name="norm2")(x)
        y = nn.Dense(self.mlp_dim, name="fc1")(y)
        y = nn.gelu(y, approximate="erf_gelu" not in self.parity)
        x = x + nn.Dense(self.embed_dim, name="fc2")(y)
        x = nn.LayerNorm(epsilon=self.eps, use_fast_variance=fast, name="final_norm")(x)
        return nn.Dense(self.num_classes, name="head")(x.mean(axis=1))


def linen_model(config: Any, parity: frozenset[str] = frozenset()) -> nn.Module:
    a = config.settings
    if config.arch == "mlp":
        return MLP(a.hidden, config.num_classes)
    if config.arch == "attention":
        return AttentionClassifier(a.embed_dim, a.num_heads, a.mlp_dim, a.layer_norm_eps, config.num_classes, parity)
    raise ValueError(f"arch = {config.arch!r}: no linen twin; allowed: {', '.join(MODELS)}")


def canonical_params(model: nnx.Module, parity: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The NNX model's parameters as the linen twin's `params` (the same values, copied; for
    nn.MultiHeadDotProductAttention the attention kernels reshaped to its per-head (embed, heads, head_dim) layout)."""
    pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    params = jax.tree.map(jnp.array, pure)
    if model.config.arch != "attention":
        return params
    block = params.pop("block")
    params |= {"norm1": block["norm1"], "norm2": block["norm2"], "fc1": block["mlp"]["fc1"],
               "fc2": block["mlp"]["fc2"], "attn": block["attn"]}
    if "einsum_attention" not in parity:  # nn.MultiHeadDotProductAttention: per-head kernels, no out bias
        attn, heads = params["attn"], model.config.settings.num_heads
        embed = attn["query"]["kernel"].shape[0]
        params["attn"] = {**{name: {"kernel": attn[name]["kernel"].reshape(embed, heads, embed // heads)}
                             for name in ("query", "key", "value")},
                          "out": {"kernel": attn["out"]["kernel"].reshape(heads, embed // heads, embed)}}
    return params


def make_tx(optimizer: AdamSpec | SGDSpec, num_steps: int, torch_adam: bool) -> optax.GradientTransformation:
    if torch_adam:
        from rosetta_jax.train import optax_transform

        return optax_transform(optimizer, num_steps)
    if isinstance(optimizer, AdamSpec):
        return optax.adam(optimizer.learning_rate, b1=optimizer.beta1, b2=optimizer.beta2, eps=optimizer.epsilon)
    return optax.sgd(optimizer.learning_rate, momentum=optimizer.momentum)


def create_state(model: nnx.Module, optimizer: AdamSpec | SGDSpec, num_steps: int,
                 variant: str | None = None) -> train_state.TrainState:
    parity = MODEL_PARITY if variant == "parity_model" else frozenset({variant} & MODEL_PARITY)
    net = linen_model(model.config, frozenset(parity))
    return train_state.TrainState.create(apply_fn=net.apply, params=canonical_params(model, frozenset(parity)),
                                         tx=make_tx(optimizer, num_steps, variant == "torch_adam"))


@jax.jit
def train_step(state: train_state.TrainState, batch: tuple[jax.Array, jax.Array]
               ) -> tuple[train_state.TrainState, jax.Array]:
    images, labels = batch

    def loss_fn(params: Any) -> jax.Array:
        logits = state.apply_fn({"params": params}, images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


# The worker's process ran rosetta_jax.train.configure (jax_default_matmul_precision="highest"), as for every loop
# there; on a CPU that changes no compiled instruction (benchmarks/README.md), so this loop leaves it.
def train(model: nnx.Module, data: Dataset, batch_size: int, optimizer: AdamSpec | SGDSpec, epochs: int, seed: int,
          variant: str | None = None) -> LoopRun:
    """Train the linen twin of `model` (from its weights) for `epochs`; `model` itself is left as it was."""
    if variant is not None and variant not in {**TRICKS, **PARITY}:
        raise ValueError(f"variant = {variant!r}: unknown; allowed: {', '.join({**TRICKS, **PARITY})}")
    steps = len(data.train_labels) // batch_size
    state = create_state(model, optimizer, epochs * steps, variant)
    rng = np.random.default_rng(seed)
    epoch_seconds, epoch_losses = [], []
    for _ in range(epochs):
        start = time.perf_counter()
        perms = rng.permutation(len(data.train_labels))[: steps * batch_size].reshape(steps, batch_size)
        losses = []
        for perm in perms:
            state, loss = train_step(state, (data.train_inputs[perm], data.train_labels[perm]))
            losses.append(loss)
        epoch_losses.append(float(np.mean(jax.device_get(losses))))  # waits for the epoch's last step
        epoch_seconds.append(time.perf_counter() - start)
    return LoopRun(epoch_seconds, steps * batch_size, epoch_losses)
