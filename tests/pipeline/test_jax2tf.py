"""The jax2tf route (tooling/build/jax2tf): a rosetta_jax model converted to a TensorFlow SavedModel, reloaded by
TF 2.21 in a fresh process, and its logits compared with JAX's under the fp32 export bound of params.yaml; in the
environment that holds both frameworks, built from its own lock, which must stay the union of the tf and jax locks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipelines.environments import lock_path
from rosetta_common.testing import asymmetric_weights, small_config
from rosetta_common.weights import save_weights
from tooling.build.jax2tf import env

REPO = Path(__file__).resolve().parents[2]
# Dense layers, convolutions with BatchNorm's statistics, and lax.scan (a While loop inside the XlaCallModule op).
ARCHS = ("mlp", "cnn", "lstm")


def test_lock_is_the_union_of_the_tf_and_jax_locks() -> None:
    """Every distribution of either lock, at its version and with its hashes, and nothing else: what holds both
    frameworks is exactly what each was tested with (`python -m tooling.build.jax2tf.env lock` rewrites it)."""
    union = env.entries(env.LOCK)
    sources = [env.entries(lock_path(name, "cpu")) for name in env.SOURCES]
    assert set(union) == set().union(*sources)
    for source in sources:
        for name, pin in source.items():
            assert union[name] == pin, name


def jax2tf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tooling.build.jax2tf.env", "run", "--", "python", "-m",
                           "tooling.build.jax2tf.export", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=1200)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run folders as train_export leaves them, as far as the route reads them: native/config.json and
    trained.safetensors (small models, asymmetric weights: a transposed kernel or swapped gate would show)."""
    root = tmp_path_factory.mktemp("jax-runs")
    for seed, arch in enumerate(ARCHS):
        config = small_config(arch)
        (root / arch / "native").mkdir(parents=True)
        (root / arch / "native" / "config.json").write_text(config.model_dump_json())
        save_weights(root / arch / "trained.safetensors", asymmetric_weights(config, seed), arch)
    rng = np.random.default_rng(0)
    np.savez(root / "images.npz", images=rng.random((33, *small_config("mlp").image_shape), dtype=np.float32))
    return root


def test_savedmodel_reloads_in_a_fresh_process_and_matches_jax(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    saved = jax2tf("save", "--out", str(out), "--images", str(runs / "images.npz"), *(str(runs / a) for a in ARCHS))
    assert saved.returncode == 0, saved.stderr[-3000:]
    # A planted copy whose JAX logits are off by 10 bounds: the check must catch it, and only it.
    shutil.copytree(out / "mlp", out / "mlp-planted")
    with np.load(out / "mlp" / "reference.npz", allow_pickle=False) as data:
        images, logits = data["images"], data["jax_logits"]
    np.savez(out / "mlp-planted" / "reference.npz", images=images, jax_logits=logits + 10 * (1e-5 + np.abs(logits)))

    checked = jax2tf("check", "--out", str(out))  # a fresh process: only the files on disk
    assert checked.returncode == 1, checked.stdout + checked.stderr[-3000:]
    assert checked.stderr.strip().splitlines()[-1] == "error: SavedModel logits over the bound: mlp-planted"
    results = {r["model"]: r for r in json.loads((out / "check.json").read_text())}
    assert set(results) == {*ARCHS, "mlp-planted"}
    for arch in ARCHS:
        assert results[arch]["within"] and results[arch]["max_abs_difference"] <= results[arch]["bound"], arch
        assert (results[arch]["shape"], results[arch]["dtype"]) == ([33, 10], "float32")
    assert not results["mlp-planted"]["within"]


def test_a_run_folder_without_weights_is_one_error_and_writes_nothing(runs: Path, tmp_path: Path) -> None:
    broken = tmp_path / "cnn"
    shutil.copytree(runs / "cnn", broken)
    (broken / "trained.safetensors").unlink()
    done = jax2tf("save", "--out", str(tmp_path / "out"), "--images", str(runs / "images.npz"), str(runs / "mlp"),
                  str(broken))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: run {broken}: {broken / 'trained.safetensors'} is missing; allowed: a finished jax run folder, "
        "e.g. artifacts/jax/cnn")
    assert not (tmp_path / "out").exists()
