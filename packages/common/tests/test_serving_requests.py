"""rosetta_common.serving's request checks, where there is no kserve (the orchestrator): importing the module and
checking a request need numpy alone. The servers themselves are tested for real in tests/test_serving.py."""

import sys
from types import SimpleNamespace

import numpy as np
import pytest

from rosetta_common.serving import RequestError, Signature, images_from_v1, images_from_v2

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
