"""rosetta_common.serving's request checks, where there is no kserve (the orchestrator): importing the modules and
checking a request need numpy alone. The servers themselves are tested for real in tests/system/test_serving.py."""

import hashlib
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from rosetta_common import data
from rosetta_common.serving.names import batch_kind, batch_sha256
from rosetta_common.serving.requests import (
    RequestError,
    Signature,
    TokenSignature,
    images_from_v1,
    images_from_v2,
    request_input,
    tokens_from_v1,
    tokens_from_v2,
)
from rosetta_common.testing import small_config

SIGNATURE = Signature(height=2, width=3, classes=10)
IMAGES = np.linspace(0, 1, 12, dtype=np.float32).reshape(2, 2, 3)


def tensor(data=None, shape=(2, 2, 3), datatype="FP32", name="images", raw=None):
    """A stand-in with the fields of kserve's InferInput that the checks read."""
    return SimpleNamespace(name=name, datatype=datatype, shape=list(shape), data=data, _raw_data=raw)


def v2(*inputs, outputs=None):
    return SimpleNamespace(inputs=list(inputs), request_outputs=outputs, id=None)


def test_the_module_imports_no_kserve():
    assert "kserve" not in sys.modules


def test_good_requests_give_the_float32_images_bit_for_bit():
    for images in (images_from_v1({"instances": IMAGES.tolist()}, SIGNATURE),
                   images_from_v1(b'{"instances": %s}' % str(IMAGES.tolist()).encode(), SIGNATURE),
                   images_from_v2(v2(tensor(IMAGES.ravel().tolist())), SIGNATURE),
                   images_from_v2(v2(tensor(IMAGES.tolist())), SIGNATURE),  # nested data is allowed too
                   images_from_v2(v2(tensor([], raw=IMAGES.astype("<f4").tobytes())), SIGNATURE)):
        assert images.dtype == np.float32 and np.array_equal(images, IMAGES)


@pytest.mark.parametrize(("payload", "says"), [
    ({"instances": IMAGES[:, :, :2].tolist()}, "instances: shape [2, 2, 2] is not allowed; allowed: one FP32 "
                                               "input 'images' of shape [n, 2, 3] (n >= 1)"),
    ({"instances": []}, "instances: shape [0] is not allowed"),
    ({"instances": [[["a", "b", "c"]] * 2]}, "instances: holds strings; allowed: numbers"),
    ({"instances": [[[True] * 3] * 2]}, "instances: holds booleans"),
    ({"instances": [[[0, 1, 0], [0, 1]]]}, "instances: nested lists of unequal lengths"),
    ({"instances": (IMAGES * 255).tolist()}, "instances: values from 0 to 255 are not allowed; allowed: images in "
                                             "[0, 1]"),
    ({"instances": "abc"}, "instances: a JSON str; allowed: a list of images"),
    ({"inputs": []}, "instances: missing (the body has ['inputs'])"),
    ([1, 2], "body: a JSON list; allowed: an object"),
    (b"{not json", "body: not JSON (Expecting property name"),
])
def test_bad_v1_requests_are_one_line_naming_the_field(payload, says):
    with pytest.raises(RequestError) as refused:
        images_from_v1(payload, SIGNATURE)
    assert says in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(("request_", "says"), [
    (v2(), "inputs: no input named 'images' (got [])"),
    (v2(tensor(IMAGES.ravel().tolist(), name="pixels")), "inputs: no input named 'images' (got ['pixels'])"),
    (v2(tensor(IMAGES.ravel().tolist()), tensor([0.0])), "inputs: ['images', 'images']: 2 inputs"),
    (v2(tensor(IMAGES.ravel().tolist(), datatype="FP64")), "inputs[0].datatype: 'FP64' is not allowed; allowed: "
                                                           "'FP32'"),
    (v2(tensor(IMAGES.ravel().tolist(), shape=(2, 3, 2))), "inputs[0].shape: [2, 3, 2] is not allowed"),
    (v2(tensor(IMAGES.ravel().tolist()[:-1])), "inputs[0].data: 11 values do not fill shape [2, 2, 3]; allowed: "
                                               "exactly 12 numbers"),
    (v2(tensor([], raw=b"\0" * 13)), "inputs[0].data: 13 raw bytes; allowed: 4 bytes per FP32 value"),
    (v2(tensor(["x"] * 12)), "inputs[0].data: holds strings"),
    (v2(tensor([float("nan")] * 12)), "inputs[0].data: holds NaN or infinity"),
    (v2(tensor(IMAGES.ravel().tolist()), outputs=[SimpleNamespace(name="probs")]),
     "outputs[0].name: 'probs' is not allowed; allowed: 'logits'"),
])
def test_bad_v2_requests_are_one_line_naming_the_field(request_, says):
    with pytest.raises(RequestError) as refused:
        images_from_v2(request_, SIGNATURE)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_the_signature_is_the_onnx_conventions():
    """What every server's V2 metadata says of a model's tensors (-1: the protocol's variable batch)."""
    assert SIGNATURE.inputs() == [{"name": "images", "datatype": "FP32", "shape": [-1, 2, 3]}]
    assert SIGNATURE.outputs() == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]


# --- the token model: one INT64 input "tokens" [n, length], checked as InputSpec.check checks it -------------------

TOKEN_SIGNATURE = TokenSignature(max_length=6, vocab_size=50, classes=2)
TOKENS = np.array([[5, 7, 9, 0, 0], [3, 49, 1, 2, 8]], np.int64)  # padded (PAD_ID 0), ids 1..49


def token_tensor(data=None, shape=TOKENS.shape, datatype="INT64", name="tokens", raw=None):
    return tensor(data, shape=shape, datatype=datatype, name=name, raw=raw)


def test_a_token_config_gives_the_token_signature():
    config = small_config("text_transformer")
    signature = Signature.of(config)
    assert signature == TokenSignature(max_length=config.max_length, vocab_size=config.vocab_size,
                                       classes=config.num_classes)
    assert signature.input == config.input
    assert Signature.of(small_config("mlp")) == Signature(height=8, width=8, classes=10)


def test_good_token_requests_give_the_int64_ids_exactly():
    for tokens in (tokens_from_v1({"instances": TOKENS.tolist()}, TOKEN_SIGNATURE),
                   tokens_from_v1(b'{"instances": %s}' % str(TOKENS.tolist()).encode(), TOKEN_SIGNATURE),
                   tokens_from_v2(v2(token_tensor(TOKENS.ravel().tolist())), TOKEN_SIGNATURE),
                   tokens_from_v2(v2(token_tensor(TOKENS.tolist())), TOKEN_SIGNATURE),
                   tokens_from_v2(v2(token_tensor([], raw=TOKENS.astype("<i8").tobytes())), TOKEN_SIGNATURE),
                   tokens_from_v1({"instances": TOKENS[:, :1].tolist()}, TOKEN_SIGNATURE)[:, :1],  # length 1
                   ):
        assert tokens.dtype == np.int64 and np.array_equal(tokens, TOKENS[:, :tokens.shape[1]])
    full = np.ones((1, 6), np.int64)  # exactly max_length
    assert np.array_equal(tokens_from_v2(v2(token_tensor(full.ravel().tolist(), shape=(1, 6))), TOKEN_SIGNATURE),
                          full)


@pytest.mark.parametrize(("payload", "says"), [
    ({"instances": (TOKENS + 50).tolist()}, "instances: token id 99 outside the vocabulary 0..49"),
    ({"instances": (TOKENS - 1).tolist()}, "instances: token id -1 outside the vocabulary 0..49"),
    ({"instances": [[2 ** 70, 1]]}, "instances: token id 1180591620717411303424 outside the vocabulary 0..49"),
    ({"instances": [[2 ** 63, 1]]}, "instances: token id 9223372036854775808 outside the vocabulary 0..49"),
    ({"instances": [[1] * 7]}, "instances: sequence length 7, longer than the model's maximum 6"),
    ({"instances": [[5, 7, 0], [0, 0, 0]]}, "instances: row 1 is all padding (id 0); every row needs at least one "
                                            "token"),
    ({"instances": TOKENS.astype(np.float32).tolist()}, "instances: holds numbers that are not integers"),
    ({"instances": [[0.5, 1]]}, "instances: holds numbers that are not integers"),
    ({"instances": [["a", "b"]]}, "instances: holds strings; allowed: integers, one INT64 input 'tokens' of shape "
                                  "[n, length] (n >= 1, 1 <= length <= 6), token ids 0..49 (pad 0)"),
    ({"instances": [[True, False]]}, "instances: holds booleans"),
    ({"instances": [[1, None]]}, "instances: holds objects"),
    ({"instances": [[1, 2, 3], [4, 5]]}, "instances: nested lists of unequal lengths"),
    ({"instances": [1, 2, 3]}, "instances: shape [3] is not allowed; allowed: one INT64 input 'tokens'"),
    ({"instances": [[[1, 2]]]}, "instances: shape [1, 1, 2] is not allowed"),
    ({"instances": []}, "instances: shape [0] is not allowed"),
    ({"instances": [[]]}, "instances: shape [1, 0] is not allowed"),
    ({"instances": "abc"}, "instances: a JSON str; allowed: a list of rows"),
    ({"inputs": []}, "instances: missing (the body has ['inputs']); allowed: {\"instances\": [row, ...]}"),
    ([1, 2], "body: a JSON list; allowed: an object"),
])
def test_bad_v1_token_requests_are_one_line_naming_the_field(payload, says):
    with pytest.raises(RequestError) as refused:
        tokens_from_v1(payload, TOKEN_SIGNATURE)
    assert says in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(("request_", "says"), [
    (v2(token_tensor((TOKENS + 50).ravel().tolist())), "inputs[0].data: token id 99 outside the vocabulary 0..49"),
    (v2(token_tensor([], raw=(TOKENS + 50).astype("<i8").tobytes())), "inputs[0].data: token id 99 outside"),
    (v2(token_tensor([1] * 7, shape=(1, 7))), "inputs[0].data: sequence length 7, longer than the model's maximum 6"),
    (v2(token_tensor([5, 0, 0, 0], shape=(2, 2))), "inputs[0].data: row 1 is all padding (id 0)"),
    (v2(token_tensor(TOKENS.ravel().tolist(), datatype="FP32")), "inputs[0].datatype: 'FP32' is not allowed; "
                                                                 "allowed: 'INT64'"),
    (v2(token_tensor(TOKENS.ravel().tolist(), datatype="INT32")), "inputs[0].datatype: 'INT32' is not allowed"),
    (v2(token_tensor((TOKENS + 0.5).ravel().tolist())), "inputs[0].data: holds numbers that are not integers"),
    (v2(token_tensor(["x"] * 10)), "inputs[0].data: holds strings"),
    (v2(token_tensor(TOKENS.ravel().tolist(), name="images")), "inputs: no input named 'tokens' (got ['images'])"),
    (v2(), "inputs: no input named 'tokens' (got [])"),
    (v2(token_tensor(TOKENS.ravel().tolist()), token_tensor([1])), "inputs: ['tokens', 'tokens']: 2 inputs"),
    (v2(token_tensor(TOKENS.ravel().tolist(), shape=(10,))), "inputs[0].shape: [10] is not allowed; allowed: one "
                                                            "INT64 input 'tokens' of shape [n, length]"),
    (v2(token_tensor([], shape=(0, 5))), "inputs[0].shape: [0, 5] is not allowed"),
    (v2(token_tensor([], shape=(2, 0))), "inputs[0].shape: [2, 0] is not allowed"),
    (v2(token_tensor(TOKENS.ravel().tolist()[:-1])), "inputs[0].data: 9 values do not fill shape [2, 5]; allowed: "
                                                     "exactly 10 integers"),
    (v2(token_tensor([], raw=b"\0" * 12)), "inputs[0].data: 12 raw bytes; allowed: 8 bytes per INT64 value"),
    (v2(token_tensor([], raw=TOKENS.astype("<i4").tobytes())), "inputs[0].data: 5 values do not fill shape [2, 5]"),
    (v2(token_tensor(TOKENS.ravel().tolist()), outputs=[SimpleNamespace(name="probs")]),
     "outputs[0].name: 'probs' is not allowed; allowed: 'logits'"),
])
def test_bad_v2_token_requests_are_one_line_naming_the_field(request_, says):
    with pytest.raises(RequestError) as refused:
        tokens_from_v2(request_, TOKEN_SIGNATURE)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_an_image_request_to_the_token_model_and_tokens_to_an_image_model_are_refused():
    with pytest.raises(RequestError, match=r"^inputs: no input named 'tokens' \(got \['images'\]\)"):
        TOKEN_SIGNATURE.from_v2(v2(tensor(IMAGES.ravel().tolist())))
    with pytest.raises(RequestError, match=r"^instances: holds numbers that are not integers"):
        TOKEN_SIGNATURE.from_v1({"instances": IMAGES[0].tolist()})
    with pytest.raises(RequestError, match=r"^inputs: no input named 'images' \(got \['tokens'\]\)"):
        SIGNATURE.from_v2(v2(token_tensor(TOKENS.ravel().tolist())))
    with pytest.raises(RequestError, match=r"^instances: shape \[2, 5\] is not allowed"):
        SIGNATURE.from_v1({"instances": TOKENS.tolist()})


def test_the_token_signature_is_the_onnx_conventions():
    """Both dimensions variable: the batch and the length (1..max_length, which InputSpec.check holds)."""
    assert TOKEN_SIGNATURE.inputs() == [{"name": "tokens", "datatype": "INT64", "shape": [-1, -1]}]
    assert TOKEN_SIGNATURE.outputs() == [{"name": "logits", "datatype": "FP32", "shape": [-1, 2]}]


def test_the_batch_hash_is_the_batch_in_its_own_dtype():
    """Images hash as float32 (the bytes rosetta_common.data.batch_sha256 hashes: an image batch's record does not
    move); token ids as int64, not as a float32 cast of them."""
    images = np.linspace(0, 1, 24).reshape(2, 3, 4)  # float64: hashed as the float32 the model reads
    assert batch_sha256(images) == data.batch_sha256(images) == batch_sha256(images.astype(np.float32))
    assert batch_sha256(TOKENS) == hashlib.sha256(TOKENS.astype("<i8").tobytes()).hexdigest()
    assert batch_sha256(TOKENS) != data.batch_sha256(TOKENS)
    assert batch_sha256(TOKENS.astype(np.int32)) == batch_sha256(TOKENS)
    assert batch_kind(images) == "images" and batch_kind(TOKENS) == "tokens"
    with pytest.raises(TypeError):
        batch_sha256(np.array(["a"]))


def test_a_batch_goes_out_as_the_input_its_model_reads():
    name, datatype, values = request_input(IMAGES.astype(np.float64))
    assert (name, datatype, values.dtype) == ("images", "FP32", np.float32)
    name, datatype, values = request_input(TOKENS.astype(np.int32))
    assert (name, datatype, values.dtype.str) == ("tokens", "INT64", "<i8") and np.array_equal(values, TOKENS)
