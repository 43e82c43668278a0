"""The TensorFlow model server: every model of an artifacts folder, served from its SavedModel's serving function.

    python -m pipelines.runner tf -- python -m rosetta_tf.serve --artifacts artifacts/tf --init artifacts/init \
        --http-port 8502 --grpc-port 8503

KServe's ModelServer, V1 and V2 over REST and V2 over gRPC on 127.0.0.1, one line on stdout when ready, a clean
stop on SIGTERM or SIGINT. Everything but loading and running the export is rosetta_common.serving's, shared
with rosetta_torch.serve, rosetta_jax.serve and pipelines.serve_onnx (same names in each).
"""

from __future__ import annotations

from pathlib import Path

from rosetta_common import serving
from rosetta_common.spec import ModelConfig
from rosetta_tf.export import SAVED_MODEL_DIR, _read_config, load_native
from rosetta_tf.models import build, predict
from rosetta_tf.train import configure

kserve = serving.import_kserve()  # not `import kserve`: it would parse our command line

SERVER = "tf"
# load_native's predict that calls the SavedModel's `serve` function: the concrete function its "serving_default"
# signature (the one TF Serving runs) wraps, returning the logits tensor itself rather than a dict.
SERVED_FORMAT = serving.SERVED_FORMAT[SERVER]
SERVED_FILE = Path("native") / SAVED_MODEL_DIR


def run_config(run_dir: Path) -> ModelConfig:
    """The run's ModelConfig: config.json beside the SavedModel."""
    return _read_config(run_dir / "native")[0]


class NativeModel(serving.ServedModel, kserve.Model):
    """One run folder's SavedModel, loaded once by rosetta_tf.export.load_native (a graph: no Python classes)."""

    def __init__(self, name: str, run_dir: Path) -> None:
        super().__init__(name)
        self.run_dir = run_dir

    def load(self) -> bool:
        self.signature = serving.Signature.of(run_config(self.run_dir))
        self.forward = load_native(self.run_dir / "native")[SERVED_FORMAT]
        self.ready = True
        return self.ready


class InitModel(serving.ServedModel, kserve.Model):
    """<model>-init: rosetta_tf's Keras model of the canonical init weights (models.build, inference mode, as
    train_export builds it), run by models.predict; the run's config, the init stage's weights."""

    def __init__(self, name: str, run_dir: Path, init_file: Path) -> None:
        super().__init__(name)
        self.run_dir, self.init_file = run_dir, init_file

    def load(self) -> bool:
        config = run_config(self.run_dir)
        self.signature = serving.Signature.of(config)
        self.forward = serving.init_forward(build, predict, config, self.init_file)
        self.ready = True
        return self.ready


def main(argv: list[str] | None = None) -> int:
    # configure: TF's deterministic ops, as train_export ran the same graph (inference draws no random number,
    # so the seed is immaterial).
    return serving.main(argv, server=SERVER, served_file=SERVED_FILE, model=NativeModel,
                        init_model=InitModel, configure=lambda: configure(0))


if __name__ == "__main__":
    raise SystemExit(main())
