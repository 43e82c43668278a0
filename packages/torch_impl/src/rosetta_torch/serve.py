"""The torch model server: every model of an artifacts folder, served from its torch.export program (model.pt2).

    python -m pipelines.runner torch -- python -m rosetta_torch.serve --artifacts artifacts/torch \
        --init artifacts/init --http-port 8500 --grpc-port 8501

KServe's ModelServer, V1 and V2 over REST and V2 over gRPC on 127.0.0.1, one line on stdout when ready, a clean
stop on SIGTERM or SIGINT. Everything but loading and running the export is rosetta_common.serving's, shared
with rosetta_tf.serve, rosetta_jax.serve and pipelines.serve_onnx (same names in each): an image model's FP32
images and the token model's INT64 ids are decoded and checked there (Signature.of(config)), and load_native's
program runs either.
"""

from __future__ import annotations

from pathlib import Path

from rosetta_common import serving
from rosetta_common.spec import ModelConfig
from rosetta_torch.export import PROGRAM_FILE, STATE_FILE, load_native, load_state_file
from rosetta_torch.models import build, model_config, predict
from rosetta_torch.train import configure

kserve = serving.import_kserve()  # not `import kserve`: it would parse our command line

SERVER = "torch"
SERVED_FORMAT = serving.SERVED_FORMAT[SERVER]  # the key of load_native's predict that runs model.pt2
SERVED_FILE = Path("native") / PROGRAM_FILE


def run_config(run_dir: Path) -> ModelConfig:
    """The run's ModelConfig: the program holds none; the state file beside it, from the same model, does."""
    return model_config(load_state_file(run_dir / "native" / STATE_FILE))


class NativeModel(serving.ServedModel, kserve.Model):
    """One run folder's torch.export program, loaded once by rosetta_torch.export.load_native (no pickle)."""

    def __init__(self, name: str, run_dir: Path) -> None:
        super().__init__(name)
        self.run_dir = run_dir

    def load(self) -> bool:
        self.signature = serving.Signature.of(run_config(self.run_dir))
        self.forward = load_native(self.run_dir / "native")[SERVED_FORMAT]
        self.ready = True
        return self.ready


class InitModel(serving.ServedModel, kserve.Model):
    """<model>-init: rosetta_torch's model of the canonical init weights (models.build, eval mode, as train_export
    builds it), run by models.predict; the run's config, the init stage's weights."""

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
    # configure: torch's deterministic kernels, as train_export ran the same program (inference draws no random
    # number, so the seed is immaterial).
    return serving.main(argv, server=SERVER, served_file=SERVED_FILE, model=NativeModel,
                        init_model=InitModel, configure=lambda: configure(0))


if __name__ == "__main__":
    raise SystemExit(main())
