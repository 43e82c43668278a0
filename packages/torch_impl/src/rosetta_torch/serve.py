"""The torch model server: every model of an artifacts folder, served from its torch.export program (model.pt2).

    python -m pipelines.runner torch -- python -m rosetta_torch.serve --artifacts artifacts/torch \
        --init artifacts/init --http-port 8500 --grpc-port 8501

Only what is torch's: where the run's config is, how the program is loaded (rosetta_torch.export.load_native, no
pickle), which models.build and models.predict make and run the init twin, and torch's deterministic kernels.
The protocols, the checks of a request, the command line and the server are rosetta_common.serving's, the same
for rosetta_tf.serve, rosetta_jax.serve and pipelines.serving.onnx.
"""

from __future__ import annotations

import functools
from pathlib import Path

from rosetta_common import serving
from rosetta_common.interface import Predict
from rosetta_common.serving import server
from rosetta_common.spec import ModelConfig
from rosetta_torch.export import PROGRAM_FILE, STATE_FILE, load_native, load_state_file
from rosetta_torch.models import build, model_config, predict
from rosetta_torch.train import configure

SERVER = "torch"
SERVED_FORMAT = serving.SERVED_FORMAT[SERVER]  # the key of load_native's predict that runs model.pt2
SERVED_FILE = Path("native") / PROGRAM_FILE


def run_config(run_dir: Path) -> ModelConfig:
    """The run's ModelConfig: the program holds none; the state file beside it, from the same model, does."""
    return model_config(load_state_file(run_dir / "native" / STATE_FILE))


class NativeModel(server.NativeModel):
    """One run folder's torch.export program, loaded once by rosetta_torch.export.load_native (no pickle)."""

    def load_export(self) -> Predict:
        return load_native(self.run_dir / "native")[SERVED_FORMAT]

    def run_config(self) -> ModelConfig:
        return run_config(self.run_dir)


def main(argv: list[str] | None = None) -> int:
    # configure: torch's deterministic kernels, as train_export ran the same program (inference draws no random
    # number, so the seed is immaterial).
    init_model = functools.partial(server.InitModel, run_config=run_config, build=build, predict=predict)
    return server.main(argv, server=SERVER, served_file=SERVED_FILE, model=NativeModel, init_model=init_model,
                       configure=lambda: configure(0))


if __name__ == "__main__":
    raise SystemExit(main())
