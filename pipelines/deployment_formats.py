"""The export formats a finished run ships, and what deploying each one takes: documented facts, with sources.

benchmarks/deployment.py measures each format (file size, cold start in a fresh process, latency) and records
these facts beside its figures; the report (pipelines/report/deployment.py) shows them as a table of their own,
a pure function of this module (no measurement in it). Numpy-free and import-light: both sides import it.

"Verified" means this repository shows it: benchmarks/deployment.py loads and runs the file in a fresh process
that imports only what `imports` names (it records the modules it found loaded), and Rosetta's own server for it
(docs/serving.md) answers bit for bit as the same export run in process. Everything else is documented by the
source linked; none of those servers is run by Rosetta.
"""

from __future__ import annotations

from dataclasses import dataclass

# Sources, one per documented fact (stable documentation pages or the project's own issue tracker).
TF_SERVING = "https://www.tensorflow.org/tfx/guide/serving"
KSERVE_RUNTIMES = "https://kserve.github.io/website/docs/concepts/resources/servingruntime"
TRITON_ONNX = "https://github.com/triton-inference-server/onnxruntime_backend"
TRITON_TF = "https://github.com/triton-inference-server/tensorflow_backend"
TRITON_PYTORCH = "https://github.com/triton-inference-server/pytorch_backend"
TRITON_AOTI_ISSUE = "https://github.com/triton-inference-server/server/issues/8414"
ORT_C_API = "https://onnxruntime.ai/docs/api/c/"
OPENVINO_FORMATS = "https://docs.openvino.ai/2025/openvino-workflow/model-preparation.html"
OPENVINO_JAX = "https://docs.openvino.ai/2025/openvino-workflow/model-preparation/convert-model-jax.html"
TORCH_EXPORT = "https://docs.pytorch.org/docs/stable/export.html"
AOT_INDUCTOR = "https://docs.pytorch.org/docs/stable/torch.compiler_aot_inductor.html"
TORCHSCRIPT_DEPRECATED = "https://docs.pytorch.org/docs/stable/jit_language_reference.html"
TORCHSERVE = "https://docs.pytorch.org/serve/"
JAX_EXPORT = "https://docs.jax.dev/en/latest/export/export.html"
KERAS_SAVING = "https://keras.io/guides/serialization_and_saving/"


@dataclass(frozen=True)
class Format:
    """One export format of a run folder (artifacts/<framework>/<model>/), as a deployment target."""

    name: str  # the key used everywhere: torch_export, keras, saved_model, jax_export, onnx
    framework: str  # whose run folder holds it; "*" for ONNX, which every framework exports
    env: str  # the Rosetta environment that loads it (pipelines/environments.py)
    file: str  # relative to the run folder: a file or a folder
    imports: str  # what a process must import to load and run it (benchmarks/deployment_worker.py does exactly that)
    distributions: tuple[str, ...]  # the wheels of that runtime, for "the framework package alone" (any present)
    python: str  # whether serving it needs a Python interpreter, and the way around it if there is one
    model_code: str  # whether loading it needs the model's own Python code
    servers: str  # servers and runtimes documented to load it
    rosetta: str  # what Rosetta itself serves it with
    sources: tuple[str, ...]


FORMATS: tuple[Format, ...] = (
    Format(
        "torch_export", "torch", "torch", "native/model.pt2", "torch", ("torch",),
        python="yes: torch.export.load rebuilds the program in Python; C++ only after AOTInductor compiles it into "
               "its own .pt2 package (torch._inductor.aoti_compile_and_package, prototype), a different file",
        model_code="no: the program holds the graph and weights",
        servers="no off-the-shelf server documents this file: Triton's PyTorch backend runs TorchScript or a "
                "Python torch.compile model, AOTInductor support is an open request; TorchServe (limited "
                "maintenance) runs eager and TorchScript models; OpenVINO converts an ExportedProgram in Python",
        rosetta="rosetta_torch.serve (KServe ModelServer, torch environment)",
        sources=(TORCH_EXPORT, AOT_INDUCTOR, TRITON_PYTORCH, TRITON_AOTI_ISSUE, TORCHSERVE, OPENVINO_FORMATS),
    ),
    Format(
        "keras", "tf", "tf", "native/model.keras", "tensorflow, keras, rosetta_tf.models", ("tensorflow-cpu",
                                                                                          "tensorflow", "keras"),
        python="yes: Keras is Python; TF Serving cannot read it (export a SavedModel)",
        model_code="yes: the file names rosetta_tf's registered classes (AddChannel, TorchAdam, StepLoss), which "
                   "must be importable to load it in safe mode",
        servers="Keras itself (any backend); no model server reads .keras directly",
        rosetta="not served: the tf server serves the SavedModel beside it",
        sources=(KERAS_SAVING,),
    ),
    Format(
        "saved_model", "tf", "tf", "native/saved_model", "tensorflow", ("tensorflow-cpu", "tensorflow"),
        python="no: TF Serving is C++ (tensorflow_model_server); the TF C and C++ APIs load it too",
        model_code="no: a graph with its variables (tf.saved_model.load needs no Python class)",
        servers="TF Serving; KServe's TF Serving and Triton runtimes; Triton's TensorFlow backend; OpenVINO "
                "(read_model)",
        rosetta="rosetta_tf.serve (KServe ModelServer, tf environment)",
        sources=(TF_SERVING, KSERVE_RUNTIMES, TRITON_TF, OPENVINO_FORMATS),
    ),
    Format(
        "jax_export", "jax", "jax", "native/forward.jax_export", "jax", ("jax", "jaxlib"),
        python="yes: jax.export.deserialize is JAX's; the StableHLO module inside could be compiled by XLA/PJRT "
               "from C++, with no documented off-the-shelf loader for this file",
        model_code="no: StableHLO with the weights as constants (flax and rosetta_jax are not imported)",
        servers="none documented; OpenVINO converts JAX/Flax objects in Python (experimental), not this file",
        rosetta="rosetta_jax.serve (KServe ModelServer, jax environment)",
        sources=(JAX_EXPORT, OPENVINO_JAX),
    ),
    Format(
        "onnx", "*", "validation", "model.onnx", "onnxruntime", ("onnxruntime",),
        python="no: ONNX Runtime's C/C++ API (and C#, Java, JavaScript); Triton's ONNX Runtime backend is C++",
        model_code="no: the graph and weights in one file",
        servers="ONNX Runtime; Triton's ONNX Runtime backend (KServe's Triton runtime); OpenVINO (read_model)",
        rosetta="pipelines.serving.onnx (KServe ModelServer on ONNX Runtime, validation environment)",
        sources=(ORT_C_API, TRITON_ONNX, KSERVE_RUNTIMES, OPENVINO_FORMATS),
    ),
)

# Not measured, and why (TorchScript is the format users compare with ONNX and SavedModel).
NOT_MEASURED = {
    "torchscript": "deprecated since PyTorch 2.x in favour of torch.export, which Rosetta exports (model.pt2); and "
                   "a TorchScript archive is a zip of pickles (data.pkl, constants.pkl), which Rosetta never ships",
    "safetensors / flax_msgpack": "weights only: loading them needs the package's own model code (rosetta_torch, "
                                  "rosetta_jax), not a deployment format on their own",
}


def by_name(name: str) -> Format:
    for found in FORMATS:
        if found.name == name:
            return found
    raise KeyError(name)
