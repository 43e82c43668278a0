"""Each environment holds exactly one framework (validation: none), from its own hash-pinned lock."""

import json
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import pytest

from pipelines.environments import ENVIRONMENTS, VARIANTS, find_links, lock_path
from support import REPO, orchestrator_env, run_in

FRAMEWORK_MODULES = {"torch": "torch", "tf": "tensorflow", "jax": "jax"}
# Whether each top-level package is installed, found as `import` would find it, without importing it (TF's import
# alone is seconds; that each environment's framework imports and works is what its own suite shows).
PROBE = (
    "import importlib.util, json\n"
    "found = {m: importlib.util.find_spec(m) is not None\n"
    "         for m in ('torch', 'tensorflow', 'jax', 'onnxruntime', 'rosetta_common')}\n"
    "print(json.dumps(found))\n"
)


def probe(env: str) -> dict[str, bool]:
    result = run_in(env, PROBE)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_validation_env_has_onnxruntime_and_common_but_no_framework():
    found = probe("validation")
    assert found["onnxruntime"] and found["rosetta_common"]
    assert not found["torch"] and not found["tensorflow"] and not found["jax"]


@pytest.mark.parametrize("env", ["torch", "tf", "jax"])
def test_framework_env_holds_exactly_its_own_framework(env):
    found = probe(env)
    frameworks = {m for m in FRAMEWORK_MODULES.values() if found[m]}
    assert frameworks == {FRAMEWORK_MODULES[env]}
    assert found["rosetta_common"]


@pytest.mark.parametrize("env", list(ENVIRONMENTS))
@pytest.mark.parametrize("variant", VARIANTS)
def test_locks_are_exact_hash_pinned_and_hold_one_framework(env, variant):
    path = lock_path(env, variant)
    if not path.is_file():
        pytest.skip(f"{path.relative_to(REPO)} not generated yet")
    text = path.read_text()
    requirements = re.findall(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)", text, flags=re.M)
    assert requirements, "lock lists no requirement"
    blocks = [b for b in re.split(r"\n(?=\S)", text.strip()) if b and not b.startswith("#")]
    assert all("--hash=sha256:" in b for b in blocks), "every requirement carries a hash"
    names = {name.lower() for name, _ in requirements}
    holds = {
        fw
        for fw, dists in {
            "torch": {"torch"},
            "tf": {"tensorflow", "tensorflow-cpu"},
            "jax": {"jax", "jaxlib"},
        }.items()
        if names & dists
    }
    assert holds == ({env} if env in FRAMEWORK_MODULES else set())
    assert not {"onnxruntime", "onnxruntime-gpu"} <= names, "onnxruntime and onnxruntime-gpu never together"
    assert "/" not in "".join(line for line in text.splitlines() if not line.strip().startswith("--hash"))


# ---- where torch's CPU wheel comes from without any configuration ---------------------------------------------

NO_FIND_LINKS = ("ROSETTA_FIND_LINKS", "UV_FIND_LINKS", "PIP_FIND_LINKS")


def local_torch_wheel(filename_version: str) -> Path | None:
    """The lock's torch wheel in the local wheel folder this machine configures (PIP_FIND_LINKS or pip's
    find-links), read from the real environment before a test clears it; None where there is none."""
    links = find_links()
    if not links or ("://" in links and not links.startswith("file://")):
        return None
    folder = Path(links.removeprefix("file://"))
    found = sorted(folder.glob(f"torch-{filename_version}-cp311-*.whl")) if folder.is_dir() else []
    return found[0] if found else None


@contextmanager
def simple_index(wheel: Path | None) -> Iterator[tuple[str, list[str]]]:
    """A PEP 503 index on 127.0.0.1 serving torch alone (its /simple/torch/ page links `wheel`, if any); yields its
    URL and the paths it was asked for."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            if self.path.rstrip("/") == "/simple/torch":
                link = f'<a href="/files/{quote(wheel.name)}">{wheel.name}</a>' if wheel else ""
                self.reply(f"<!DOCTYPE html><html><body>{link}</body></html>".encode(), "text/html")
            elif wheel and self.path == f"/files/{quote(wheel.name)}":
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(wheel.stat().st_size))
                self.end_headers()
                with open(wheel, "rb") as f:
                    shutil.copyfileobj(f, self.wfile, 1 << 20)
            else:
                self.send_error(404)

        def reply(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_torch_cpu_env_builds_from_the_torch_index_without_configuration(tmp_path):
    """No find-links anywhere (no variable, no pip config): the runner asks the torch CPU index for the +cpu wheel
    (here a loopback index standing in for PyTorch's: ROSETTA_TORCH_INDEX), and says so in one line; the other
    pins come from the default index as usual."""
    pins = re.findall(r"^torch==(\S+)", lock_path("torch", "cpu").read_text(), flags=re.M)
    assert len(pins) == 1 and pins[0].endswith("+cpu"), pins
    wheel = local_torch_wheel(pins[0])  # before the environment is cleared
    with simple_index(wheel) as (index, asked):
        env = {k: v for k, v in orchestrator_env().items() if k not in (*NO_FIND_LINKS, "ROSETTA_RUNTIME")}
        env.update(PIP_CONFIG_FILE="/dev/null", ROSETTA_TORCH_INDEX=index, ROSETTA_ENVS_DIR=str(tmp_path / "envs"),
                   ROSETTA_VARIANT="cpu")
        built = subprocess.run([sys.executable, "-m", "pipelines.runner", "--setup", "torch"], cwd=REPO, env=env,
                               capture_output=True, text=True, check=False)
        output = f"exit {built.returncode}\n{built.stderr[-4000:]}"
        assert f"[rosetta] torch-cpu: torch's CPU wheel from {index} " in built.stderr, output
        assert "/simple/torch/" in asked or "/simple/torch" in asked, f"{asked}\n{output}"
        if wheel is None:  # nothing to serve: the index was asked, and the build fails in one line
            assert built.returncode != 0, output
            assert re.search(r"^error: packages/torch_impl/requirements-cpu\.lock: building environment torch-cpu "
                             r"failed", built.stderr, flags=re.M), output
            assert not (tmp_path / "envs" / "torch-cpu").exists(), output
            return
        assert built.returncode == 0, output
        assert f"/files/{quote(wheel.name)}" in asked, f"{asked}\n{output}"  # the wheel itself came from the index
    imported = run_in("torch", "import torch; print(torch.__version__)", ROSETTA_ENVS_DIR=str(tmp_path / "envs"),
                      PIP_CONFIG_FILE="/dev/null")
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert imported.stdout.strip().splitlines()[-1] == pins[0]
    assert "building environment" not in imported.stderr  # built once, then reused
