"""<model>-init, the init twin each server serves beside every model: the model of the shared canonical init
weights (`--init`, artifacts/init/<arch>.safetensors, the file every framework's train_export starts from).

A framework's server builds it with its package's models.build from that file and runs it with models.predict,
as train_export builds and runs it (the ONNX server runs the run folder's init.onnx, that model exported). Its
weights are the same bits in every framework, so its logits must agree across servers within the forward-parity
tolerance, which the trained models' (trained apart) need not. Apart from the server, which imports kserve: the
file's checks are tested without it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rosetta_common.errors import ArtifactError, RosettaError, one_line
from rosetta_common.interface import Predict
from rosetta_common.spec import ModelConfig
from rosetta_common.weights import load_weights


def init_file(init_dir: Path, model: str) -> Path:
    """The canonical init weights of `model` in the init stage's folder."""
    return init_dir / f"{model}.safetensors"


def load_init(path: Path, config: ModelConfig) -> dict[str, np.ndarray]:
    """The canonical init weights at `path`, checked against `config` (names, shapes, dtype, architecture, all
    finite): what train_export's jobs load (rosetta_common.weights.load_weights)."""
    try:
        return load_weights(path, config)
    except RosettaError:
        raise
    except Exception as error:  # a file that is not safetensors at all
        raise ArtifactError(f"{path}: not readable canonical weights ({one_line(str(error))})") from None


def init_forward(build: Callable[[ModelConfig, Any], Any], predict: Callable[[Any, np.ndarray], np.ndarray],
                 config: ModelConfig, path: Path) -> Predict:
    """The framework's model of the canonical init weights at `path`: `build(config, weights)` (the contract's
    models.build: the native model holding those weights, in inference mode, as train_export builds it from the
    same file) run by `predict` (models.predict, as train_export records init_validation_logits)."""
    model = build(config, load_init(path, config))
    return lambda inputs: predict(model, inputs)
