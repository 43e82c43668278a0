"""rosetta_common.serving's init twins, where there is no kserve: the served names, the --init flag, and the
canonical init weights loaded as train_export loads them. The servers serving them are tested for real in
tests/system/test_serving.py and tests/pipeline/test_serve_stage.py."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from rosetta_common.errors import ArtifactError
from rosetta_common.serving.cli import find_models, parse_args
from rosetta_common.serving.init_twins import init_file, init_forward, load_init
from rosetta_common.serving.names import INIT_SUFFIX, init_name, served_models, served_name
from rosetta_common.spec import ARCHITECTURES, TOKEN_ARCHITECTURES, ModelConfig, Spec
from rosetta_common.weights import init_weights, save_weights

DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # KServe's InferenceService and TrainedModel names


def test_every_model_is_served_with_its_init_twin_right_after_it():
    assert served_models(["mlp", "cnn"]) == ["mlp", "mlp-init", "cnn", "cnn-init"]
    assert all(DNS_1123_LABEL.fullmatch(init_name(model)) for model in Spec().models)
    assert init_name("gru").endswith(INIT_SUFFIX) and "kserve" not in sys.modules


def test_every_model_has_a_served_name_that_is_a_dns_label():
    """KServe's names are DNS-1123 labels: text_transformer is served as text-transformer, its twin as
    text-transformer-init; an image model's name is its own; every architecture's names are labels."""
    assert "text_transformer" in ARCHITECTURES
    assert served_name("text_transformer") == "text-transformer"
    assert init_name("text_transformer") == "text-transformer-init"
    assert served_models(["mlp", "text_transformer"]) == ["mlp", "mlp-init", "text-transformer",
                                                          "text-transformer-init"]
    names = served_models(ARCHITECTURES)
    assert len(set(names)) == len(names) == 2 * len(ARCHITECTURES)
    assert all(DNS_1123_LABEL.fullmatch(name) and len(name) <= 63 for name in names), names
    assert all(served_name(model) == model for model in ARCHITECTURES if model not in TOKEN_ARCHITECTURES)
    assert served_name(served_name("text_transformer")) == "text-transformer"  # a served name serves as itself
    for bad in ("Text", "a.b", "-a", "a" * 60, ""):
        with pytest.raises(ValueError, match="cannot be served under a DNS-1123 label"):
            served_name(bad)


def test_a_run_folder_is_served_under_its_served_name(tmp_path, capsys):
    """--models takes the run folder's name or its served name; two folders one served name is refused."""
    for folder in ("mlp", "text_transformer"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model.onnx").write_bytes(b"")
    found = find_models(tmp_path, None, Path("model.onnx"))
    assert list(found) == ["mlp", "text_transformer"]
    assert find_models(tmp_path, ["text-transformer", "mlp"], Path("model.onnx")) == {
        "text_transformer": tmp_path / "text_transformer", "mlp": tmp_path / "mlp"}
    (tmp_path / "text-transformer").mkdir()
    (tmp_path / "text-transformer" / "model.onnx").write_bytes(b"")
    with pytest.raises(SystemExit, match="run folders text-transformer and text_transformer would both be served "
                                         "as 'text-transformer'"):
        find_models(tmp_path, None, Path("model.onnx"))
    (tmp_path / "Bad").mkdir()
    (tmp_path / "Bad" / "model.onnx").write_bytes(b"")
    with pytest.raises(SystemExit, match="model 'Bad': cannot be served"):
        find_models(tmp_path, ["Bad"], Path("model.onnx"))


def test_the_init_flag_names_a_folder(tmp_path, capsys):
    common = ["--artifacts", str(tmp_path), "--http-port", "8500", "--grpc-port", "8501"]
    assert parse_args([*common, "--init", str(tmp_path)], "test").init == tmp_path
    with pytest.raises(SystemExit):
        parse_args([*common, "--init", str(tmp_path / "nope")], "test")
    assert f"--init {tmp_path / 'nope'}: not a folder; allowed: the init stage's folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(common, "test")  # required: every server serves the init twins


def test_the_init_forward_builds_from_the_canonical_file_as_train_export_does(tmp_path):
    config = ModelConfig.of(Spec(), "mlp", (8, 8), 10)
    weights = init_weights(config, 0)
    save_weights(init_file(tmp_path, "mlp"), weights, "mlp")
    built = {}

    def build(config_, loaded):
        built.update(config=config_, weights=loaded)
        return "model"

    predict = init_forward(build, lambda model, images: np.zeros((len(images), 10), np.float32), config,
                           init_file(tmp_path, "mlp"))
    assert built["config"] == config and built["weights"].keys() == weights.keys()
    assert all(np.array_equal(built["weights"][k], weights[k]) for k in weights)
    assert predict(np.zeros((3, 8, 8), np.float32)).shape == (3, 10)


def test_a_file_that_is_not_canonical_weights_is_one_line_naming_it(tmp_path):
    config = ModelConfig.of(Spec(), "mlp", (8, 8), 10)
    path = init_file(tmp_path, "mlp")
    path.write_bytes(b"not safetensors")
    with pytest.raises(ArtifactError) as refused:
        load_init(path, config)
    assert str(path) in str(refused.value) and "\n" not in str(refused.value)
