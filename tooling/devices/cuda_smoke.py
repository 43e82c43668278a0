"""Smoke check of one CUDA environment in its image: the CUDA build, its libraries, TF32 off, where it computes.

    make smoke-cuda            # the four CUDA images (torch, tf, jax, validation)
    ROSETTA_RUNTIME=container ROSETTA_VARIANT=cuda python -m pipelines.runner torch -- \
        python -m tooling.devices.cuda_smoke

The CUDA images must be checkable without a GPU, so this shows inside each (ROSETTA_ENV, set by the runner, names
the environment) what can be shown there: that the framework is the CUDA build, that every library of the nvidia-*
wheels loads but those that need the driver a GPU host supplies, and that TF32 is off after the package's own
configure(); then a float32 matmul against float64, on the GPU, or without one on the CPU after one line that says
so. Exit 0 when every check passes (a missing GPU is not a failure, unless --require-gpu, which `make gpu-check`
passes), else 1 with the failed check named; --json PATH writes the findings for tooling/devices/gpu_check.py's report.
The checks one by one and what they find: docs/containers.md, "CUDA", and containers/README.md.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np

# The NVIDIA driver's library: the host's, never in an image (on a GPU host the NVIDIA Container Toolkit mounts it),
# so a library that links it cannot load in an image without a GPU, and that is not a failure.
DRIVER = "libcuda.so.1"
# Host fabric libraries (InfiniBand verbs, MPI, PMIx, OpenSHMEM, libfabric, UCX) that only the optional multi-node
# plugins of cuFile (libcufile_rdma) and NVSHMEM (nvshmem_bootstrap_*, nvshmem_transport_*) link; those plugins are
# loaded only when such a fabric is configured, never by single-host training, so an image need not have them.
FABRIC = frozenset({"libmlx5.so.1", "libibverbs.so.1", "librdmacm.so.1", "libmpi.so.40", "libpmix.so.2",
                    "liboshmem.so.40", "libfabric.so.1", "libucs.so.0", "libucp.so.0"})
SHARED_LIBRARY = re.compile(r"\.so(\.\d+)*$")
MATMUL_N = 256
MATMUL_RTOL = 1e-4  # float32 vs float64 at n=256 is ~1e-6 relative; TF32 (10-bit mantissa) ~1e-3


class SmokeFailure(Exception):
    pass


@dataclass
class Findings:
    env: str
    framework: str = ""
    version: str = ""
    cuda_build: str = ""
    gpu: bool = False
    devices: list[str] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)
    passed: bool = False
    failure: str = ""

    def say(self, line: str) -> None:
        self.facts.append(line)
        print(f"{self.env}: {line}", flush=True)


def check(condition: object, failure: str) -> None:
    if not condition:
        raise SmokeFailure(failure)


def version_of(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ""


# ---------------------------------------------------------------- pure helpers (tested without any framework)


def missing_library(error: str) -> str:
    """The library a failed dlopen could not find ("libcuda.so.1: cannot open shared object file: ..."), else ""."""
    match = re.match(r"^(?:.*?: )?([^\s:/]+\.so[.\d]*): cannot open shared object file", error)
    return match.group(1) if match else ""


def classify_loads(results: dict[str, str]) -> tuple[list[str], list[str], dict[str, str], dict[str, str]]:
    """From library -> "" or dlopen's error: (loaded, needing only the driver, multi-node plugins needing a fabric
    library: library -> what it lacks, failing otherwise: library -> reason)."""
    loaded = [lib for lib, error in results.items() if not error]
    driver = [lib for lib, error in results.items() if error and missing_library(error) == DRIVER]
    fabric = {lib: missing_library(error) for lib, error in results.items() if missing_library(error) in FABRIC}
    broken = {lib: error for lib, error in results.items() if error and lib not in driver and lib not in fabric}
    return loaded, driver, fabric, broken


def no_gpu_line(framework: str, build: str) -> str:
    """The one line a CUDA build without a GPU prints."""
    return f"no GPU visible: {framework} runs on CPU (CUDA build {build})"


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def matmul_operands() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((MATMUL_N, MATMUL_N)).astype(np.float32)
    b = rng.standard_normal((MATMUL_N, MATMUL_N)).astype(np.float32)
    return a, b, a.astype(np.float64) @ b.astype(np.float64)


# ---------------------------------------------------------------- checks shared by every environment


def nvidia_libraries() -> dict[str, str]:
    """Every shared library the environment's nvidia-* wheels hold -> "" if it loads, else dlopen's error."""
    try:
        import nvidia  # a namespace package: one folder per wheel below it
    except ImportError:
        return {}
    results: dict[str, str] = {}
    seen: set[Path] = set()
    for root in map(Path, nvidia.__path__):
        for path in sorted(root.rglob("*.so*")):
            real = path.resolve()
            if not SHARED_LIBRARY.search(path.name) or real in seen or "stubs" in path.parts:
                continue
            seen.add(real)
            try:
                ctypes.CDLL(str(real), mode=os.RTLD_LAZY | os.RTLD_LOCAL)
                results[str(path.relative_to(root))] = ""
            except OSError as error:
                results[str(path.relative_to(root))] = str(error)
    return results


def check_libraries(found: Findings) -> None:
    loaded, driver, fabric, broken = classify_loads(nvidia_libraries())
    check(loaded, "no nvidia-* library found: the lock brought no CUDA libraries")
    check(not broken, "nvidia-* libraries that do not load: "
          + "; ".join(f"{lib} ({error})" for lib, error in sorted(broken.items())))
    verb = "needs" if len(driver) == 1 else "need"
    needs = f", {len(driver)} {verb} the driver's {DRIVER} (a GPU host's)" if driver else ""
    plugins = (f", {len(fabric)} multi-node plugins need fabric libraries ({', '.join(sorted(set(fabric.values())))})"
               if fabric else "")
    found.say(f"nvidia-* libraries: {len(loaded)} load{needs}{plugins}, none missing")


def check_matmul(found: Findings, where: str, compute: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
    a, b, want = matmul_operands()
    error = relative_error(compute(a, b), want)
    check(error <= MATMUL_RTOL, f"float32 matmul on {where} is {error:.1e} off float64 (TF32 on?)")
    found.say(f"float32 matmul on {where}: {error:.1e} relative to float64 (TF32 would be ~1e-3)")


def cpu_onnxruntime(found: Findings) -> None:
    """The framework images keep the CPU onnxruntime of the CPU lock: say which, it is not a CUDA check."""
    version = version_of("onnxruntime")
    if version:
        found.say(f"onnxruntime {version} (the CPU build, as in the CPU variant: ONNX Runtime on the GPU is the"
                  " validation image's)")


# ---------------------------------------------------------------- per environment


def smoke_torch(found: Findings) -> None:
    import torch

    from rosetta_torch.train import configure

    found.framework, found.version = "torch", torch.__version__
    check(torch.version.cuda, f"torch {torch.__version__} is not a CUDA build (torch.version.cuda is None)")
    found.cuda_build = torch.version.cuda
    cudnn = torch.backends.cudnn.version()  # loads libcudnn
    check(cudnn, "torch finds no cuDNN (torch.backends.cudnn.version() is None)")
    found.say(f"torch {torch.__version__}: CUDA build {torch.version.cuda}, cuDNN {cudnn}")
    check_libraries(found)
    configure(0)
    check(not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32,
          "TF32 is still on after rosetta_torch.train.configure")
    found.say("TF32 off after rosetta_torch.train.configure (matmul and cuDNN)")
    cpu_onnxruntime(found)
    if torch.cuda.is_available():
        found.gpu = True
        found.devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        found.say(f"GPU: torch runs on {', '.join(found.devices)}")
        check_matmul(found, "the GPU", lambda a, b: (torch.from_numpy(a).cuda() @ torch.from_numpy(b).cuda()).cpu())
    else:
        found.say(no_gpu_line("torch", found.cuda_build))
        check_matmul(found, "the CPU", lambda a, b: torch.from_numpy(a) @ torch.from_numpy(b))


def smoke_tf(found: Findings) -> None:
    import tensorflow as tf

    from rosetta_tf.train import configure

    found.framework, found.version = "tensorflow", tf.__version__
    check(tf.test.is_built_with_cuda(), f"tensorflow {tf.__version__} is not a CUDA build")
    info = tf.sysconfig.get_build_info()
    found.cuda_build = str(info.get("cuda_version", ""))
    found.say(f"tensorflow {tf.__version__}: built with CUDA {found.cuda_build}, cuDNN {info.get('cudnn_version')}")
    check_libraries(found)
    configure(0)
    check(not tf.config.experimental.tensor_float_32_execution_enabled(),
          "TF32 is still on after rosetta_tf.train.configure")
    found.say("TF32 off after rosetta_tf.train.configure")
    cpu_onnxruntime(found)
    gpus = tf.config.list_physical_devices("GPU")
    where = "/GPU:0" if gpus else "/CPU:0"
    if gpus:
        found.gpu = True
        found.devices = [tf.config.experimental.get_device_details(g).get("device_name", g.name) for g in gpus]
        found.say(f"GPU: tensorflow runs on {', '.join(found.devices)}")
    else:
        found.say(no_gpu_line("tensorflow", found.cuda_build))

    def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with tf.device(where):
            return tf.matmul(tf.constant(a), tf.constant(b)).numpy()

    check_matmul(found, "the GPU" if gpus else "the CPU", matmul)


def smoke_jax(found: Findings) -> None:
    plugin_versions = {name: version_of(name) for name in ("jax-cuda12-plugin", "jax-cuda12-pjrt")}
    check(all(plugin_versions.values()), f"the JAX CUDA plugin is not installed ({plugin_versions})")
    importlib.import_module("jax_cuda12_plugin")
    if not gpu_devices_present():
        # No GPU given to this container: JAX logs the CUDA plugin's failed cuInit with a traceback; the one line
        # below says it instead. With GPU devices present its errors stay visible.
        logging.getLogger("jax._src.xla_bridge").setLevel(logging.CRITICAL)
    import jax

    from rosetta_jax.train import configure

    found.framework, found.version = "jax", jax.__version__
    check(all(v == jax.__version__ for v in plugin_versions.values()),
          f"JAX CUDA plugin versions {plugin_versions} differ from jax {jax.__version__}")
    runtime = version_of("nvidia-cuda-runtime-cu12")
    found.cuda_build = ".".join(runtime.split(".")[:2]) or "12"  # jax_cuda12_plugin runs on the CUDA 12 wheels
    found.say(f"jax {jax.__version__}: CUDA plugin jax_cuda12_plugin {plugin_versions['jax-cuda12-plugin']}"
              f" (CUDA runtime wheel {runtime})")
    ptxas = next((p for p in (Path(d) / "cuda_nvcc" / "bin" / "ptxas" for d in _nvidia_dirs()) if p.is_file()), None)
    check(ptxas, "ptxas (nvidia-cuda-nvcc-cu12) is missing: XLA could not compile GPU kernels")
    out = subprocess.run([str(ptxas), "--version"], capture_output=True, text=True, check=False)
    check(out.returncode == 0, f"{ptxas} --version failed: {out.stderr.strip()}")
    found.say(f"ptxas runs: {out.stdout.strip().splitlines()[-1]}")
    check_libraries(found)
    configure(0)
    check(jax.config.jax_default_matmul_precision == "highest",
          "jax_default_matmul_precision is not 'highest' after rosetta_jax.train.configure (TF32 possible)")
    found.say("TF32 off after rosetta_jax.train.configure (jax_default_matmul_precision=highest)")
    cpu_onnxruntime(found)
    backend = jax.default_backend()
    if backend == "gpu":
        found.gpu = True
        found.devices = [d.device_kind for d in jax.devices()]
        found.say(f"GPU: jax runs on {', '.join(found.devices)}")
    else:
        found.say(no_gpu_line("jax", found.cuda_build))
    check_matmul(found, "the GPU" if found.gpu else "the CPU",
                 lambda a, b: np.asarray(jax.numpy.matmul(jax.numpy.asarray(a), jax.numpy.asarray(b))))


def gpu_devices_present() -> bool:
    """Whether NVIDIA device nodes are present (the container toolkit adds them with --gpus / the CDI device)."""
    return Path("/dev/nvidiactl").exists() or any(Path("/dev").glob("nvidia[0-9]*"))


def _nvidia_dirs() -> list[str]:
    try:
        import nvidia
    except ImportError:
        return []
    return list(nvidia.__path__)


def tiny_matmul_model(b: np.ndarray) -> bytes:
    """An ONNX model computing x @ b (IR version 10: any ONNX Runtime of these locks reads it)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "b"], ["y"])],
        "smoke",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(b.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(b.shape))],
        [numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def smoke_validation(found: Findings) -> None:
    import onnxruntime as ort

    found.framework, found.version = "onnxruntime-gpu", version_of("onnxruntime-gpu")
    check(found.version, f"onnxruntime-gpu is not installed (onnxruntime {version_of('onnxruntime')} is)")
    check(not version_of("onnxruntime"), "both onnxruntime and onnxruntime-gpu are installed")
    from onnxruntime.capi import build_and_package_info

    found.cuda_build = getattr(build_and_package_info, "cuda_version", "")
    providers = ort.get_available_providers()
    check("CUDAExecutionProvider" in providers, f"onnxruntime lists no CUDAExecutionProvider ({providers})")
    found.say(f"onnxruntime-gpu {found.version}: built for CUDA {found.cuda_build}; providers {', '.join(providers)}")
    provider = Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_cuda.so"
    try:
        ctypes.CDLL(str(provider), mode=os.RTLD_LAZY | os.RTLD_LOCAL)
        found.say(f"{provider.name} loads (every library it links is found)")
    except OSError as error:
        lacking = missing_library(str(error))
        check(lacking == DRIVER,
              f"{provider.name} does not load: {error} (LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH')})")
        found.say(f"{provider.name} finds every library it links (LD_LIBRARY_PATH) but the driver's {DRIVER}")
    check_libraries(found)
    b = matmul_operands()[1]
    ort.set_default_logger_severity(4)  # without a GPU, the CUDA provider's failure to start is the line below
    options = ort.SessionOptions()
    options.log_severity_level = 4
    session = ort.InferenceSession(tiny_matmul_model(b), options,
                                   providers=[("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"])
    ort.set_default_logger_severity(2)
    found.say("TF32 off: sessions ask the CUDA provider for use_tf32=0 (as pipelines/stages/validate.py does)")
    used = session.get_providers()
    if used[0] == "CUDAExecutionProvider":
        found.gpu = True
        device = session.get_provider_options()["CUDAExecutionProvider"].get("device_id", "0")
        found.devices = [f"CUDAExecutionProvider device {device}"]
        found.say(f"GPU: onnxruntime runs on {used[0]}")
    else:
        found.say(no_gpu_line("onnxruntime", found.cuda_build))
    where = "the GPU" if found.gpu else "the CPU"
    check_matmul(found, where, lambda x, _: session.run(None, {"x": x})[0])


SMOKES: dict[str, Callable[[Findings], None]] = {
    "torch": smoke_torch,
    "tf": smoke_tf,
    "jax": smoke_jax,
    "validation": smoke_validation,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default=os.environ.get("ROSETTA_ENV", ""), choices=list(SMOKES))
    parser.add_argument("--require-gpu", action="store_true", help="fail where the framework sees no GPU")
    parser.add_argument("--json", type=Path, help="write the findings here")
    args = parser.parse_args(argv)
    found = Findings(args.env)
    try:
        SMOKES[args.env](found)
        check(found.gpu or not args.require_gpu, f"{found.framework} sees no GPU (--require-gpu)")
        found.passed = True
    except SmokeFailure as failure:
        found.failure = str(failure)
    except ImportError as error:
        found.failure = f"cannot import {error.name}: {error}"
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(asdict(found), indent=2) + "\n")
    if not found.passed:
        print(f"{args.env}: smoke check FAILED: {found.failure}", file=sys.stderr, flush=True)
        return 1
    print(f"{args.env}: smoke check passed", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
