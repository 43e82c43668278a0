"""Build and release tooling that no DVC stage runs: images, requirement locks, the dvc.lock check, the CUDA
image smoke check, the GPU-host check and the tiny-run fixture. It imports `pipelines`; `pipelines` never
imports it, so an edit here can never move a stage's lineage."""
