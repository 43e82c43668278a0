"""Stage `data`: split the configured image source deterministically into data/prepared/{train,test}.npz, and the
text data set (rosetta_common.text: Rotten Tomatoes snippets, a tokenizer trained on its training split) into
data/prepared/text/{train,test}.npz with text/tokenizer.json, published together. The text data is prepared only
when a model that reads tokens is listed."""

from __future__ import annotations

from pipelines import measurements, paths
from pipelines.stages import IMPORTS_STARTED, stage_main
from rosetta_common.data import prepare, save_prepared
from rosetta_common.spec import TOKEN_ARCHITECTURES, load_spec


def main(argv: list[str]) -> int:
    clock = measurements.StageClock("data", IMPORTS_STARTED)
    spec = load_spec(paths.PARAMS)
    # The text first: it takes a fraction of the images' time (0.4 s against 3 s in the tests' tiny run), so a bad
    # corpus is refused before the images are prepared for nothing. Each split has its own generator from the
    # seed: the order changes no byte.
    text = tokenizer = None
    if any(m in TOKEN_ARCHITECTURES for m in spec.models):
        from rosetta_common.text import prepare_text  # only here: it imports the tokenizers library

        text, tokenizer = prepare_text(spec.data.text, spec.data.test_fraction, spec.seed)
        clock.lap("prepare_text")
    data = prepare(spec.data, spec.seed)
    clock.lap("prepare")
    save_prepared(data, paths.PREPARED, text, tokenizer.to_str(pretty=True) if tokenizer else None)
    clock.lap("save")
    measurements.write_stage(clock.record())
    print(
        f"data: {len(data.train_labels)} train / {len(data.test_labels)} test images of {data.image_shape}, "
        f"{data.num_classes} classes -> {paths.PREPARED}"
    )
    if text is not None:
        print(f"data: {len(text.train_labels)} train / {len(text.test_labels)} test snippets, vocabulary "
              f"{text.vocab_size}, {text.max_length} tokens -> {paths.PREPARED / 'text'}")
    return 0


if __name__ == "__main__":
    stage_main(main)
