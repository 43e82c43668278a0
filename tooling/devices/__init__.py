"""The checks that need an accelerator, run by whoever holds a GPU or TPU host: on a GPU host `make gpu-check`
(gpu_check) and the CUDA images' smoke check (cuda_smoke, also `make smoke-cuda` anywhere); on a TPU host
`make tpu-check` (tpu_check) with its steps: the op accuracy (tpu_ops), the bounds derived from it (tpu_bounds), the
JAX stage trained there (tpu_train), its judgement (tpu_judge), the report (tpu_report) and the TPU lock (tpu_lock).
tpu_results/ holds what a TPU run recorded (the op tables, the bounds, one result per matrix precision), which the
tests, docs/tpu.md and docs/figures.yaml read without a TPU."""
