"""A rosetta_jax model through jax2tf to a TensorFlow SavedModel, and back in a fresh process: the route that runs a
JAX model on TensorFlow's runtime (TF Serving, TFLite's converter, TF.js), checked against the JAX logits.

    python -m tooling.build.jax2tf.env run -- python -m tooling.build.jax2tf.export save --out /tmp/jax2tf \
        --images data/prepared/test.npz artifacts/jax/mlp artifacts/jax/cnn
    python -m tooling.build.jax2tf.env run -- python -m tooling.build.jax2tf.export check --out /tmp/jax2tf

`save` (one process): each run folder's model, rebuilt from its trained.safetensors and native/config.json by
rosetta_jax (inference mode, as train_export exports it), converted by jax.experimental.jax2tf.convert (native
serialization: the StableHLO module inside an XlaCallModule op, the one mode jax 0.10 has) with a symbolic batch,
saved as <out>/<model>/saved_model with a `serve` function and a "serving_default" signature as rosetta_tf's
SavedModel has them; beside it reference.npz, the images and rosetta_jax's own logits of them. `check` (run it in
another process: nothing of the saving one is left) loads each SavedModel with tf.saved_model.load, runs its
serving signature on the images and compares with the JAX logits under the fp32 export bound of params.yaml
(tolerances.onnx_vs_native_abs + onnx_vs_native_rel * max|logit|), one line per model; exit 1 when one is over.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.environments import REPO_ROOT
from rosetta_common.errors import RosettaError, one_line

SAVED_MODEL = "saved_model"
REFERENCE = "reference.npz"  # images, jax_logits
RESULT = "check.json"


def fail(message: str) -> SystemExit:
    return SystemExit(f"error: {one_line(message)}")


def read_images(path: Path) -> np.ndarray:
    try:
        with np.load(path, allow_pickle=False) as data:
            images = np.asarray(data["images"], np.float32)
    except (OSError, ValueError, KeyError) as error:
        raise fail(f"--images {path}: not an .npz with an 'images' array ({error})") from None
    if images.ndim != 3 or not len(images):
        raise fail(f"--images {path}: shape {list(images.shape)}; allowed: [n, height, width], n >= 1")
    return images


def load_model(run: Path) -> Any:
    """The run's model in inference mode, from its trained weights (what train_export exported natively)."""
    from rosetta_common.spec import CONFIG_FILE, ModelConfig
    from rosetta_common.weights import load_weights
    from rosetta_jax.export import inference_view
    from rosetta_jax.models import build

    config_path, weights = run / "native" / CONFIG_FILE, run / "trained.safetensors"
    for path in (config_path, weights):
        if not path.is_file():
            raise fail(f"run {run}: {path} is missing; allowed: a finished jax run folder, e.g. artifacts/jax/cnn")
    try:
        config = ModelConfig.model_validate_json(config_path.read_bytes())
        return inference_view(build(config, load_weights(weights, config)))
    except (RosettaError, ValueError) as error:
        raise fail(f"run {run}: {error}") from None


def save(run: Path, out: Path, images: np.ndarray) -> None:
    import tensorflow as tf
    from flax import nnx
    from jax.experimental import jax2tf

    from rosetta_jax.export import _closed_forward  # the function export_native hands to jax.export
    from rosetta_jax.models import predict

    model = load_model(run)
    height, width = model.config.image_shape
    if images.shape[1:] != (height, width):
        raise fail(f"--images: shape {list(images.shape)}; allowed: [n, {height}, {width}] for {run}")
    graphdef, state = nnx.split(model)
    # The batch symbolic, as export_native's; no gradient: a served model is never differentiated.
    converted = jax2tf.convert(partial(_closed_forward, graphdef, state),
                               polymorphic_shapes=[f"(b, {height}, {width})"], with_gradient=False)
    spec = tf.TensorSpec([None, height, width], tf.float32, name="images")
    module = tf.Module()
    module.serve = tf.function(converted, input_signature=[spec], autograph=False)

    @tf.function(input_signature=[spec])
    def serving_default(images: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"logits": module.serve(images)}

    target = out / run.name
    target.mkdir(parents=True, exist_ok=True)
    tf.saved_model.save(module, str(target / SAVED_MODEL), signatures={"serving_default": serving_default})
    np.savez(target / REFERENCE, images=images, jax_logits=predict(model, images))


def check(target: Path, bound_of: Any) -> dict[str, Any]:
    import tensorflow as tf

    try:
        with np.load(target / REFERENCE, allow_pickle=False) as data:
            images, expected = data["images"], data["jax_logits"]
    except (OSError, ValueError, KeyError) as error:
        raise fail(f"{target / REFERENCE}: not what `save` writes ({error})") from None
    loaded = tf.saved_model.load(str(target / SAVED_MODEL))  # errors here are the finding: let them through whole
    logits = loaded.signatures["serving_default"](images=tf.constant(images))["logits"].numpy()
    difference = float(np.abs(logits.astype(np.float64) - expected).max())
    bound = bound_of(expected)
    return {"model": target.name, "images": len(images), "max_abs_difference": difference, "bound": bound,
            "within": difference <= bound, "shape": list(logits.shape), "dtype": str(logits.dtype)}


def export_bound(params: Path) -> Any:
    """The fp32 export bound of params.yaml, stated there before any measurement here."""
    from rosetta_common.spec import load_spec

    tolerances = load_spec(params).tolerances
    return lambda expected: tolerances.onnx_vs_native_abs + tolerances.onnx_vs_native_rel * float(
        np.abs(expected).max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    saving = commands.add_parser("save")
    saving.add_argument("runs", nargs="+", type=Path, help="jax run folders, e.g. artifacts/jax/cnn")
    saving.add_argument("--images", type=Path, required=True, help=".npz with an 'images' array [n, height, width]")
    saving.add_argument("--out", type=Path, required=True)
    checking = commands.add_parser("check")
    checking.add_argument("--out", type=Path, required=True)
    checking.add_argument("--params", type=Path, default=REPO_ROOT / "params.yaml")
    args = parser.parse_args(argv)

    from rosetta_jax.train import configure

    configure(0)  # as train_export: full-precision matmuls, deterministic flags, before the first computation
    if args.command == "save":
        images = read_images(args.images)
        for run in args.runs:
            load_model(run)  # every run checked before anything is written
        for run in args.runs:
            save(run, args.out, images)
            print(f"saved: {args.out / run.name / SAVED_MODEL}")
        return 0
    targets = sorted(p.parent for p in args.out.glob(f"*/{REFERENCE}"))
    if not targets:
        raise fail(f"--out {args.out}: no <model>/{REFERENCE} there; allowed: the --out of `save`")
    bound_of = export_bound(args.params)
    results = [check(target, bound_of) for target in targets]
    (args.out / RESULT).write_text(json.dumps(results, indent=2) + "\n")
    for r in results:
        print(f"{r['model']}: max|tf - jax| = {r['max_abs_difference']:.3g} over {r['images']} images, bound "
              f"{r['bound']:.3g}: {'ok' if r['within'] else 'OVER'}")
    over = [r["model"] for r in results if not r["within"]]
    if over:
        print(f"error: SavedModel logits over the bound: {', '.join(over)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
