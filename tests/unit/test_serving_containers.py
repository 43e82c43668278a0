"""The serve stage's container route without an engine: the command lines pipelines/serving/containers.py builds
(the run's network, each server's detached container, the probe, the client's container, the cleanup), the
servers' `--host`, and that a start that fails half-way still removes every container and the network. The route
itself runs for real in tests/system/test_containers.py's integration run (ROSETTA_RUNTIME=container dvc repro)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipelines.containers import Engine
from pipelines.serving import containers as serving_containers
from pipelines.serving import servers as serving
from pipelines.serving.containers import (
    GRPC_PORT,
    HTTP_PORT,
    client_run_command,
    container_name,
    network_create_command,
    network_name,
    network_remove_command,
    probe_command,
    remove_command,
    server_addresses,
    server_run_command,
    stop_command,
)
from rosetta_common.serving import cli as common_serving
from support import REPO

DOCKER = Engine("docker")
NETWORK = network_name("0123abcd")
UID, GID = 4242, 4343
HOST_ENV = {"ROSETTA_CONTAINER_ARGS": "--security-opt label=disable", "SOME_TOKEN": "secret"}


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]


def server(name: str) -> list[str]:
    return server_run_command(DOCKER, name, "cpu", NETWORK, Path("artifacts"), "torch", ["mlp", "cnn"], HOST_ENV,
                              REPO, REPO, UID, GID)


def test_the_network_is_the_runs_own_and_internal():
    assert NETWORK == "rosetta-serve-0123abcd"
    assert network_create_command(DOCKER, NETWORK) == ["docker", "network", "create", "--internal", NETWORK]
    assert network_remove_command(Engine("podman"), NETWORK) == ["podman", "network", "rm", NETWORK]


@pytest.mark.parametrize(("name", "image", "module", "folder"), [
    ("torch", "rosetta-torch:cpu", "rosetta_torch.serve", "artifacts/torch"),
    ("tf", "rosetta-tf:cpu", "rosetta_tf.serve", "artifacts/tf"),
    ("jax", "rosetta-jax:cpu", "rosetta_jax.serve", "artifacts/jax"),
    ("onnx", "rosetta-validation:cpu", "pipelines.serving.onnx", "artifacts/torch"),  # torch's model.onnx
])
def test_each_server_is_a_detached_container_of_its_image_on_the_network(name, image, module, folder):
    argv = server(name)
    assert argv[:3] == ["docker", "run", "--detach"] and "--rm" not in argv  # kept when it exits: its code, its log
    assert f"--network={NETWORK}" in argv and "--pull=never" in argv
    assert flag_values(argv, "--name") == [f"{NETWORK}-{name}"] == [container_name(NETWORK, name)]
    # Mounted, mapped and passed as every stage's container (pipelines/containers.py).
    assert flag_values(argv, "--user") == [f"{UID}:{GID}"]
    assert flag_values(argv, "--volume") == [f"{REPO}:{REPO}"] and flag_values(argv, "--workdir") == [str(REPO)]
    assert "--security-opt" in argv and not any("SOME_TOKEN" in arg for arg in argv)
    command = argv[argv.index(image) + 1:]
    # The same command line as a local server process, but listening on the container's own interfaces.
    local = serving.server_arguments(name, Path("artifacts"), "torch", HTTP_PORT, GRPC_PORT, ["mlp", "cnn"])
    at = command.index("--host")
    assert command[at + 1] == "0.0.0.0" and command[:at] + command[at + 2:] == ["python", *local]
    assert command[:3] == ["python", "-m", module] and flag_values(command, "--artifacts") == [folder]
    assert flag_values(command, "--http-port") == ["8080"] and flag_values(command, "--grpc-port") == ["8081"]
    assert "--host" not in local  # a local process stays on 127.0.0.1


def test_the_client_runs_in_a_validation_container_on_the_same_network_and_finds_servers_by_name(tmp_path):
    config = tmp_path / "config.json"
    argv = client_run_command(DOCKER, "cpu", NETWORK, "pipelines.stages.serve_client", config, HOST_ENV, REPO,
                              REPO, UID, GID)
    assert argv[:3] == ["docker", "run", "--rm"] and f"--network={NETWORK}" in argv
    assert flag_values(argv, "--name") == [f"{NETWORK}-client"]
    assert argv[-5:] == ["rosetta-validation:cpu", "python", "-m", "pipelines.stages.serve_client", str(config)]
    assert server_addresses(NETWORK, ["torch", "onnx"]) == {
        "torch": {"url": f"http://{NETWORK}-torch:8080", "grpc": f"{NETWORK}-torch:8081"},
        "onnx": {"url": f"http://{NETWORK}-onnx:8080", "grpc": f"{NETWORK}-onnx:8081"}}


def test_readiness_is_probed_inside_each_server_container_and_the_stop_is_sigterm_then_kill():
    assert probe_command(DOCKER, f"{NETWORK}-tf", ["mlp", "mlp-init"]) == [
        "docker", "exec", f"{NETWORK}-tf", "python", "-m", "pipelines.serving.probe", "http://127.0.0.1:8080",
        "mlp", "mlp-init"]
    assert stop_command(DOCKER, ["a", "b"], serving.STOP_SECONDS) == ["docker", "stop", "--time", "30", "a", "b"]
    assert remove_command(DOCKER, ["a", "b"]) == ["docker", "rm", "--force", "a", "b"]


def test_a_server_that_cannot_start_is_one_line_and_every_container_and_the_network_are_removed(monkeypatch,
                                                                                              tmp_path):
    """The engine's answers stood in for (no engine runs): the jax server's `run` fails; what the session asked
    the engine for afterwards must remove all it may have made."""
    asked: list[list[str]] = []

    def engine(command, **kwargs):
        asked.append(list(command))
        failed = command[:2] == ["docker", "run"] and f"{NETWORK}-jax" in command
        return subprocess.CompletedProcess(command, 125 if failed else 0, "", "docker: Error: planted.\n" if failed
                                           else "")

    monkeypatch.setattr(serving_containers.subprocess, "run", engine)
    monkeypatch.setattr(serving_containers.containers, "select_engine", lambda: DOCKER)
    monkeypatch.setattr(serving_containers.containers, "check_image", lambda engine, env, variant: env)
    with pytest.raises(serving.ServingError) as error, serving_containers.serving_session(
            ["torch", "tf", "jax", "onnx"], Path("artifacts"), ["mlp"], "torch", tmp_path, "0123abcd"):
        pytest.fail("the session was entered")
    assert str(error.value) == (f"the jax server (container {NETWORK}-jax) could not be started: docker: Error: "
                                "planted.")
    assert asked[0] == network_create_command(DOCKER, NETWORK)
    started = [c for c in asked if c[:2] == ["docker", "run"]]
    assert [flag_values(c, "--name") for c in started] == [[f"{NETWORK}-torch"], [f"{NETWORK}-tf"], [f"{NETWORK}-jax"]]
    assert asked[-2:] == [remove_command(DOCKER, [f"{NETWORK}-{n}" for n in ("torch", "tf", "jax", "onnx", "client")]),
                          network_remove_command(DOCKER, NETWORK)]


def test_the_servers_host_is_loopback_unless_told_and_must_be_an_ipv4_address(tmp_path, capsys):
    base = ["--artifacts", str(tmp_path), "--init", str(tmp_path), "--http-port", "8080", "--grpc-port", "8081"]
    assert common_serving.parse_args(base, "x").host == "127.0.0.1" == common_serving.HOST
    assert common_serving.parse_args([*base, "--host", "0.0.0.0"], "x").host == "0.0.0.0"
    with pytest.raises(SystemExit):
        common_serving.parse_args([*base, "--host", "rosetta-serve-x"], "x")
    assert ("--host rosetta-serve-x: not an IPv4 address; allowed: e.g. 127.0.0.1 (default) or 0.0.0.0"
            in capsys.readouterr().err)


def test_each_server_runs_at_the_thread_count_its_exports_recorded(tmp_path):
    """export.json's "threads" sets the server's pools (local and container alike, servers.export_threads): its
    answers are then the recorded in-process logits bit for bit, whatever the caller's ROSETTA_THREADS. Runs that
    recorded different counts are one error naming the folder; none recorded leaves the caller's."""
    for framework, threads in (("torch", 3), ("tf", 3)):
        for model in ("mlp", "cnn"):
            (tmp_path / framework / model).mkdir(parents=True)
            (tmp_path / framework / model / "export.json").write_text(f'{{"threads": {threads}}}')
    (tmp_path / "tf" / "cnn" / "export.json").write_text('{"threads": 1}')
    assert serving.export_threads(tmp_path / "torch") == 3 and serving.export_threads(tmp_path / "jax") is None
    argv = server_run_command(DOCKER, "onnx", "cpu", NETWORK, tmp_path, "torch", ["mlp", "cnn"], HOST_ENV, REPO,
                              REPO, UID, GID)
    assert "ROSETTA_THREADS=3" in flag_values(argv, "--env") and "OMP_NUM_THREADS=3" in flag_values(argv, "--env")
    assert serving.export_threads(tmp_path / "tf", ["mlp"]) == 3
    with pytest.raises(serving.ServingError, match=r"tf: its runs were exported with different thread counts \[1, 3\]"):
        serving.export_threads(tmp_path / "tf")
