"""Each environment holds exactly one framework (validation: none), from its own hash-pinned lock."""

import json
import re

import pytest

from pipelines.environments import ENVIRONMENTS, VARIANTS, lock_path
from support import REPO, run_in

FRAMEWORK_MODULES = {"torch": "torch", "tf": "tensorflow", "jax": "jax"}
PROBE = (
    "import importlib, json\n"
    "found = {}\n"
    "for m in ('torch', 'tensorflow', 'jax', 'onnxruntime', 'rosetta_common'):\n"
    "    try:\n"
    "        importlib.import_module(m); found[m] = True\n"
    "    except ImportError:\n"
    "        found[m] = False\n"
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
