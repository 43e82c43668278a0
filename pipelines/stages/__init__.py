"""One small script per DVC stage. Each reads params.yaml through rosetta_common.spec and writes its
outputs atomically, so a failed stage leaves nothing half-written behind."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from rosetta_common.errors import RosettaError
from rosetta_common.spec import Spec, SpecError


class StageError(RosettaError):
    """A stage could not do its job for a reason the user can act on (named in the message)."""


def stage_main(main: Callable[[list[str]], int]) -> None:
    """Run a stage; turn user-facing errors (rosetta_common.errors) into one line on stderr and a non-zero exit.
    Anything else is a bug of ours and keeps its traceback."""
    try:
        code = main(sys.argv[1:])
    except SpecError as error:
        print(f"error: {error}", file=sys.stderr)
        code = 2
    except RosettaError as error:
        print(f"error: {error}", file=sys.stderr)
        code = 1
    sys.exit(code)


def check_model(spec: Spec, model: str) -> None:
    if model not in spec.models:
        raise SpecError(
            f"params.yaml: models = {list(spec.models)}: does not list {model!r}, which this stage was asked to run"
        )


def framework_stage_args(argv: list[str], doc: str) -> tuple[str, str, Spec]:
    """Parse `<framework> <model>` for a per-framework stage and load params.yaml, which is validated
    (models included) before the stage writes anything."""
    from pipelines import paths
    from rosetta_common.interface import BACKEND_MODULES
    from rosetta_common.spec import load_spec

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("framework", choices=list(BACKEND_MODULES))
    parser.add_argument("model")
    args = parser.parse_args(argv)
    spec = load_spec(paths.PARAMS)
    check_model(spec, args.model)
    return args.framework, args.model, spec
