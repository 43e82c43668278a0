"""Building, locking, testing and releasing the project, run by a maintainer or CI, mostly through a `make` target:
the images (images), every environment's locks (env_locks), the dvc.lock check (dvc_lock_check), the test runner
(run_tests) and the tiny run it and `make gpu-check` share (tiny_run), the docs' figures and their check (figures),
the KServe manifests (kserve_manifests), and the jax2tf route with its own environment (jax2tf)."""
