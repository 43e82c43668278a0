"""The JAX model server: every model of an artifacts folder, served from its serialized jax.export function.

    python -m pipelines.runner jax -- python -m rosetta_jax.serve --artifacts artifacts/jax --init artifacts/init \
        --http-port 8504 --grpc-port 8505

KServe's ModelServer, V1 and V2 over REST and V2 over gRPC on 127.0.0.1, one line on stdout when ready, a clean
stop on SIGTERM or SIGINT. Everything but loading and running the export is rosetta_common.serving's, shared
with rosetta_torch.serve, rosetta_tf.serve and pipelines.serve_onnx (same names in each).
"""

from __future__ import annotations

from pathlib import Path

from rosetta_common import serving
from rosetta_common.spec import ModelConfig
from rosetta_jax.export import CONFIG_FILE, EXPORT_FILE, load_native
from rosetta_jax.models import build, predict
from rosetta_jax.train import configure

kserve = serving.import_kserve()  # not `import kserve`: it would parse our command line

SERVER = "jax"
SERVED_FORMAT = serving.SERVED_FORMAT[SERVER]  # load_native's predict that calls the deserialized jax.export module
SERVED_FILE = Path("native") / EXPORT_FILE


def run_config(run_dir: Path) -> ModelConfig:
    """The run's ModelConfig: config.json beside the export (load_native names a missing or damaged one)."""
    return ModelConfig.model_validate_json((run_dir / "native" / CONFIG_FILE).read_bytes())


class NativeModel(serving.ServedModel, kserve.Model):
    """One run folder's jax.export artifact, loaded once by rosetta_jax.export.load_native."""

    def __init__(self, name: str, run_dir: Path) -> None:
        super().__init__(name)
        self.run_dir = run_dir

    def load(self) -> bool:
        self.forward = load_native(self.run_dir / "native")[SERVED_FORMAT]  # first: it names a damaged config.json
        self.signature = serving.Signature.of(run_config(self.run_dir))
        self.ready = True
        return self.ready


class InitModel(serving.ServedModel, kserve.Model):
    """<model>-init: rosetta_jax's Flax model of the canonical init weights (models.build, inference mode, as
    train_export builds it), run by models.predict; the run's config, the init stage's weights. Loaded after the
    run's <model> (serving.main's order), whose load_native has checked config.json."""

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
    # configure: JAX's deterministic flags and full-precision matmuls, before the first computation, as
    # train_export ran (inference draws no random number, so the seed is immaterial).
    return serving.main(argv, server=SERVER, served_file=SERVED_FILE, model=NativeModel,
                        init_model=InitModel, configure=lambda: configure(0))


if __name__ == "__main__":
    raise SystemExit(main())
