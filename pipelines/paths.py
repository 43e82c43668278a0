"""Where every stage reads and writes: the artifact layout in one place.

Lineage (DVC outputs, each stage's published whole):
- data/prepared/ (data);
- artifacts/init/<model>.safetensors (init: one folder, every model's canonical initial weights);
- artifacts/<framework>/<model>/ (train_export@<framework>: one output folder per framework, which one process
  of that framework fills, model by model, each model's run folder published at once when it is complete);
- artifacts/served/ (serve: what the four model servers returned for the validation batch);
- reports/validation.json (validate), reports/comparison/ (report).
Not lineage: measurements/ (timings; pipelines/measurements.py) and .rosetta/ (scratch; rosetta_common.io).
Callers use the functions below, never a path spelled out.
"""

from __future__ import annotations

from pathlib import Path

PARAMS = Path("params.yaml")
PREPARED = Path("data/prepared")
ARTIFACTS = Path("artifacts")
INIT = ARTIFACTS / "init"  # the init stage's one output folder
REPORTS = Path("reports")


def init_weights(model: str) -> Path:
    return INIT / f"{model}.safetensors"


def framework_dir(framework: str) -> Path:
    """The train_export@<framework> stage's one DVC output: a run folder per model."""
    return ARTIFACTS / framework


def run_dir(model: str, framework: str) -> Path:
    return framework_dir(framework) / model


def data_parallel_dir(framework: str) -> Path:
    """The train_dp@<framework> stage's one DVC output: a run folder per data-parallel model (empty when off)."""
    return ARTIFACTS / "data_parallel" / framework


def data_parallel_run(model: str, framework: str) -> Path:
    """A data-parallel run folder: trained.safetensors, train_log.json, metrics.json, as a run_dir has."""
    return data_parallel_dir(framework) / model


NULL_PLAN = ARTIFACTS / "null_plan.json"  # the null_plan stage's output: the models that train replicates to the end


def replicates_dir(framework: str) -> Path:
    """The replicates@<framework> stage's one DVC output: a folder of replicates per model null_plan names."""
    return ARTIFACTS / "replicates" / framework


def replicates_run(model: str, framework: str) -> Path:
    """One model's end-of-training replicates (replicates.json, replicates.npz), a run_dir's own measured null."""
    return replicates_dir(framework) / model


NULL_INTERIM = ARTIFACTS / "null_interim.json"  # the null_interim stage's output: the models that train more


def replicates_more_dir(framework: str) -> Path:
    """The replicates_more@<framework> stage's one DVC output: the replicates after the interim look."""
    return ARTIFACTS / "replicates_more" / framework


def replicates_more_run(model: str, framework: str) -> Path:
    """One model's replicates after the interim look, numbered on from its replicates_run's."""
    return replicates_more_dir(framework) / model


REPLICATES_RECORD = "replicates.json"  # in a replicates_run, or a data-parallel run folder
REPLICATES_ARRAYS = "replicates.npz"


def trained_weights(model: str, framework: str) -> Path:
    return run_dir(model, framework) / "trained.safetensors"


def train_log(model: str, framework: str) -> Path:
    return run_dir(model, framework) / "train_log.json"


def native_dir(model: str, framework: str) -> Path:
    return run_dir(model, framework) / "native"


def onnx_model(model: str, framework: str) -> Path:
    return run_dir(model, framework) / "model.onnx"


def init_onnx(model: str, framework: str) -> Path:
    return run_dir(model, framework) / "init.onnx"


def native_outputs(model: str, framework: str) -> Path:
    return run_dir(model, framework) / "native_outputs.npz"


# A run folder's taps (rosetta_common.taps) of the validation batch: "init/<tap>" and "trained/<tap>".
TAPS_FILE = "taps.npz"
# Each run's state at tolerances.lockstep_checkpoints: "step<s>/<canonical name>" and "step<s>/validation_logits".
CHECKPOINTS_FILE = "checkpoints.npz"
TAP_KINDS = ("init", "trained")


def taps(model: str, framework: str) -> Path:
    return run_dir(model, framework) / TAPS_FILE


# native_outputs.npz also holds, per native format as reloaded, the logits an inference-mode check needs (the
# validator has no framework to run them): two runs on the validation batch, and its first images each alone.
NATIVE_ALONE = 8  # images predicted alone (rosetta_common.metrics.inference_mode_problems looks at the first 4)


def native_inference_keys(fmt: str) -> tuple[str, str]:
    """native_outputs.npz's keys for one native format: (2, batch, classes) runs, (NATIVE_ALONE, classes) alone."""
    return f"inference_{fmt}_batch_runs", f"inference_{fmt}_alone"


def export_record(model: str, framework: str) -> Path:
    return run_dir(model, framework) / "export.json"


def metrics(model: str, framework: str) -> Path:
    """Test accuracy and loss as the train_export stage measured them (the validate stage recomputes its own)."""
    return run_dir(model, framework) / "metrics.json"


# Files that cannot be made to repeat byte for byte: kept out of the hashed lineage (.dvcignore lists the same
# pattern, export.json does not hash them, and docs/lineage.md says why).
UNHASHED: tuple[str, ...] = ()


def unhashed(relative: Path) -> bool:
    """Whether a file of a run folder (path relative to it) is outside the hashed lineage."""
    return any(str(relative).startswith(prefix) for prefix in UNHASHED)


# The serve stage's one output folder (pipelines/stages/serve.py): per server, the validation batch's logits as
# each protocol returned them (<server>/<protocol>.npz, one array per model) and every model's metadata
# (<server>/metadata.json), and index.json: what was served and the sha256 of every other file of the folder.
SERVED = ARTIFACTS / "served"
SERVED_INDEX = SERVED / "index.json"
SERVED_OFF = SERVED / "off.json"  # instead of all of it, where a stage cannot serve (validate says why)
SERVED_PROTOCOLS = ("v1", "v2", "grpc")  # V1 REST, V2 REST, V2 gRPC


def served_logits(server: str, protocol: str, root: Path = SERVED) -> Path:
    return root / server / f"{protocol}.npz"


def served_metadata(server: str, root: Path = SERVED) -> Path:
    return root / server / "metadata.json"


VALIDATION = REPORTS / "validation.json"
REPORT = REPORTS / "comparison"  # the report stage's one output folder
SUMMARY = REPORT / "summary"  # one headline-metrics file per model, for `dvc metrics show`
PLOTS = REPORT / "plots"


def summary(model: str) -> Path:
    return SUMMARY / f"{model}.json"
