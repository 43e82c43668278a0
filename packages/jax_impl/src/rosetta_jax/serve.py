"""The JAX model server: every model of an artifacts folder, served from its serialized jax.export function.

    python -m pipelines.runner jax -- python -m rosetta_jax.serve --artifacts artifacts/jax --init artifacts/init \
        --http-port 8504 --grpc-port 8505

Only what is JAX's: where the run's config is, how the export is loaded (rosetta_jax.export.load_native), which
models.build and models.predict make and run the init twin, and JAX's deterministic flags and full-precision
matmuls. The protocols, the checks of a request, the command line and the server are rosetta_common.serving's,
the same for rosetta_torch.serve, rosetta_tf.serve and pipelines.serving.onnx.
"""

from __future__ import annotations

import functools
from pathlib import Path

from rosetta_common import serving
from rosetta_common.interface import Predict
from rosetta_common.serving import server
from rosetta_common.spec import CONFIG_FILE, ModelConfig
from rosetta_jax.export import EXPORT_FILE, load_native
from rosetta_jax.models import build, predict
from rosetta_jax.train import configure

SERVER = "jax"
SERVED_FORMAT = serving.SERVED_FORMAT[SERVER]  # load_native's predict that calls the deserialized jax.export module
SERVED_FILE = Path("native") / EXPORT_FILE


def run_config(run_dir: Path) -> ModelConfig:
    """The run's ModelConfig: config.json beside the export (read after load_native, which names a missing or
    damaged one)."""
    return ModelConfig.model_validate_json((run_dir / "native" / CONFIG_FILE).read_bytes())


class NativeModel(server.NativeModel):
    """One run folder's jax.export artifact, loaded once by rosetta_jax.export.load_native."""

    def load_export(self) -> Predict:
        return load_native(self.run_dir / "native")[SERVED_FORMAT]

    def run_config(self) -> ModelConfig:
        return run_config(self.run_dir)


def main(argv: list[str] | None = None) -> int:
    # configure: JAX's deterministic flags and full-precision matmuls, before the first computation, as
    # train_export ran (inference draws no random number, so the seed is immaterial).
    init_model = functools.partial(server.InitModel, run_config=run_config, build=build, predict=predict)
    return server.main(argv, server=SERVER, served_file=SERVED_FILE, model=NativeModel, init_model=init_model,
                       configure=lambda: configure(0))


if __name__ == "__main__":
    raise SystemExit(main())
