"""The TensorFlow model server: every model of an artifacts folder, served from its SavedModel's serving function.

    python -m pipelines.runner tf -- python -m rosetta_tf.serve --artifacts artifacts/tf --init artifacts/init \
        --http-port 8502 --grpc-port 8503

Only what is TensorFlow's: where the run's config is, how the SavedModel is loaded (rosetta_tf.export.load_native:
a graph, no Python classes), which models.build and models.predict make and run the init twin, and TF's
deterministic ops. The protocols, the checks of a request, the command line and the server are
rosetta_common.serving's, the same for rosetta_torch.serve, rosetta_jax.serve and pipelines.serving.onnx.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from rosetta_common import serving
from rosetta_common.interface import Predict
from rosetta_common.serving import server
from rosetta_common.spec import CONFIG_FILE, ModelConfig
from rosetta_tf.export import SAVED_MODEL_DIR, load_native
from rosetta_tf.models import build, predict
from rosetta_tf.train import configure

SERVER = "tf"
# load_native's predict that calls the SavedModel's `serve` function: the concrete function its "serving_default"
# signature (the one TF Serving runs) wraps, returning the logits tensor itself rather than a dict.
SERVED_FORMAT = serving.SERVED_FORMAT[SERVER]
SERVED_FILE = Path("native") / SAVED_MODEL_DIR


def run_config(run_dir: Path) -> ModelConfig:
    """The run's ModelConfig: config.json's "model" beside the SavedModel (read after load_native, which names a
    missing or damaged one)."""
    return ModelConfig.model_validate(json.loads((run_dir / "native" / CONFIG_FILE).read_text())["model"])


class NativeModel(server.NativeModel):
    """One run folder's SavedModel, loaded once by rosetta_tf.export.load_native (a graph: no Python classes)."""

    def load_export(self) -> Predict:
        return load_native(self.run_dir / "native")[SERVED_FORMAT]

    def run_config(self) -> ModelConfig:
        return run_config(self.run_dir)


def main(argv: list[str] | None = None) -> int:
    # configure: TF's deterministic ops, as train_export ran the same graph (inference draws no random number,
    # so the seed is immaterial).
    init_model = functools.partial(server.InitModel, run_config=run_config, build=build, predict=predict)
    return server.main(argv, server=SERVER, served_file=SERVED_FILE, model=NativeModel, init_model=init_model,
                       configure=lambda: configure(0))


if __name__ == "__main__":
    raise SystemExit(main())
