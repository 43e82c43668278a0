"""Where the frameworks part on your own weights: every per-layer tap (rosetta_common.taps) of each framework's
forward and of the float64 reference, on one batch, compared pairwise and against the reference.

    .venv/bin/python -m tooling.diagnose.where_they_part <arch> <weights.safetensors> [--images N] [--frameworks ...]
        [--tolerance T]

<weights.safetensors> is a canonical weights file of <arch> as params.yaml configures it (rosetta_common.weights;
artifacts/init/<arch>.safetensors is one). Each framework runs in its own environment through the runner
(tooling.diagnose.taps_worker), the data passed through temporary .npz files (never pickle). The batch is the first N
images of the prepared data's validation batch (data/prepared), or N seeded random images of the shape
--image-shape where the data is not prepared. Prints one row per tap with each comparison's max abs error
("*": over the tolerance, params.yaml tolerances.forward_parity_abs unless given), then the first divergent
tap of each comparison.

Exit status: 0 every comparison agrees at every tap, 1 some part, 2 bad input (one line `error: ...`), 3 a
framework's run failed (its last line of output).
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pipelines import paths
from pipelines.environments import REPO_ROOT
from rosetta_common.data import load_prepared
from rosetta_common.errors import RosettaError, WeightsError
from rosetta_common.reference import forward_with_taps
from rosetta_common.spec import ARCHITECTURES, FRAMEWORKS, ModelConfig, load_spec
from rosetta_common.taps import TapDiff, first_divergent
from rosetta_common.weights import load_weights

RANDOM_SEED = 0  # the random images where no data is prepared: the same batch on every call


class BadInput(Exception):
    """One line naming the field, the value and what is allowed."""


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tooling.diagnose.where_they_part",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("arch", help=f"one of {', '.join(ARCHITECTURES)}")
    parser.add_argument("weights", type=Path, help="a canonical safetensors weights file of that architecture")
    parser.add_argument("--images", type=int, default=8, help="batch size (default 8)")
    parser.add_argument("--frameworks", nargs="+", default=None, help="default: params.yaml's frameworks")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="max abs error per tap (default: params.yaml tolerances.forward_parity_abs)")
    parser.add_argument("--image-shape", default="8x8",
                        help="HxW of the random images where data/prepared is absent (default 8x8, digits')")
    return parser.parse_args(argv)


def batch(count: int, image_shape: str) -> tuple[np.ndarray, str]:
    """The images and where they came from, in words."""
    if count < 1:
        raise BadInput(f"--images = {count}: must be at least 1")
    if (REPO_ROOT / paths.PREPARED).is_dir():
        data = load_prepared(REPO_ROOT / paths.PREPARED)
        available = len(data.test_labels)
        if count > available:
            raise BadInput(f"--images = {count}: the prepared test split has {available} images")
        return data.validation_batch(count), f"the first {count} images of {paths.PREPARED}'s validation batch"
    try:
        height, width = (int(side) for side in image_shape.lower().split("x"))
    except ValueError:
        raise BadInput(f"--image-shape = {image_shape!r}: expected HxW, e.g. 8x8") from None
    images = np.random.default_rng(RANDOM_SEED).random((count, height, width), dtype=np.float32)
    return images, f"{count} seeded random {height}x{width} images ({paths.PREPARED} is absent)"


def framework_taps(framework: str, arch: str, weights: Path, images: np.ndarray, classes: int,
                   scratch: Path) -> dict[str, np.ndarray]:
    """The framework's taps, from tooling.diagnose.taps_worker in its own environment."""
    request, out = scratch / "images.npz", scratch / f"{framework}.npz"
    if not request.exists():
        with open(request, "wb") as f:
            np.savez(f, images=images)
    height, width = images.shape[1:]
    command = [sys.executable, "-m", "pipelines.runner", framework, "--", "python", "-m",
               "tooling.diagnose.taps_worker", framework, arch, str(weights.resolve()), str(request), str(out),
               str(height), str(width), str(classes)]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines() or ["no output"]
        raise RuntimeError(f"{framework}: {lines[-1]} (exit status {result.returncode})")
    with np.load(out, allow_pickle=False) as f:
        return {key: f[key] for key in f.files}


def table(comparisons: dict[str, dict[str, TapDiff]], tolerance: float) -> list[str]:
    """One row per tap, one column per comparison: max abs error, "*" where over the tolerance."""
    names = list(next(iter(comparisons.values())))
    width = max(len(n) for n in names)
    columns = list(comparisons)
    cells = [[f"{comparisons[c][n].max_abs:.1e}{'*' if not comparisons[c][n].max_abs <= tolerance else ' '}"
              for c in columns] for n in names]
    widths = [max(len(c), 9) for c in columns]
    lines = ["  ".join([f"{'tap':<{width}}", *(f"{c:>{w}}" for c, w in zip(columns, widths, strict=True))])]
    for name, row in zip(names, cells, strict=True):
        lines.append("  ".join([f"{name:<{width}}", *(f"{v:>{w}}" for v, w in zip(row, widths, strict=True))]))
    return lines


def main(argv: list[str]) -> int:
    args = parse(argv)
    spec = load_spec(REPO_ROOT / paths.PARAMS)
    if args.arch not in ARCHITECTURES:
        raise BadInput(f"arch = {args.arch!r}: unknown; allowed: {', '.join(ARCHITECTURES)}")
    frameworks = args.frameworks or list(spec.frameworks)
    unknown = [fw for fw in frameworks if fw not in FRAMEWORKS]
    if unknown:
        raise BadInput(f"--frameworks = {' '.join(unknown)}: unknown; allowed: {', '.join(FRAMEWORKS)}")
    if not args.weights.is_file():
        raise BadInput(f"weights = {args.weights}: no such file")
    tolerance = spec.tolerances.forward_parity_abs if args.tolerance is None else args.tolerance
    if not tolerance > 0:
        raise BadInput(f"--tolerance = {args.tolerance}: must be positive")
    images, source = batch(args.images, args.image_shape)
    # the classes come from the file itself (its head's bias); every other size from params.yaml and the images
    try:
        with_classes = load_weights(args.weights)
        classes = int(with_classes["head.bias"].shape[0])
    except KeyError:
        raise BadInput(f"weights = {args.weights}: no head.bias, not a canonical {args.arch} file") from None
    config = ModelConfig.of(spec, args.arch, images.shape[1:], classes)
    try:
        weights = load_weights(args.weights, config)  # names, shapes, dtype, finiteness
    except WeightsError as error:
        raise BadInput(f"{error} (canonical shapes as params.yaml's architecture.{args.arch} sets them)") from None
    reference = forward_with_taps(config, weights, images)
    with tempfile.TemporaryDirectory(prefix="where_they_part-") as scratch:
        native = {fw: framework_taps(fw, args.arch, args.weights, images, classes, Path(scratch))
                  for fw in frameworks}
    comparisons = {f"{fw}-ref": first_divergent(native[fw], reference, tolerance) for fw in frameworks}
    comparisons |= {f"{a}|{b}": first_divergent(native[a], native[b], tolerance)
                    for a, b in itertools.combinations(frameworks, 2)}
    print(f"{args.arch} from {args.weights}, on {source}; max abs error per tap, * over {tolerance:.0e}")
    print("\n".join(table({c: diffs for c, (_, diffs) in comparisons.items()}, tolerance)))
    print("first divergent tap:")
    for c, (first, diffs) in comparisons.items():
        said = "none (every tap agrees)" if first is None else f"{first} (max abs {diffs[first].max_abs:.2e})"
        print(f"  {c}: {said}")
    return 1 if any(first is not None for first, _ in comparisons.values()) else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (BadInput, RosettaError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(3)
