"""One small script per DVC stage. Each reads params.yaml through rosetta_common.spec and writes its
outputs atomically, so a failed stage leaves nothing half-written behind."""

from __future__ import annotations

import time

# When the first stage module began importing: the interpreter's own start lies before it, our imports after it
# (pipelines.measurements.StageClock reports both).
IMPORTS_STARTED = time.time()

import argparse  # noqa: E402  (after the timestamp, which must come first)
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402

from rosetta_common.errors import RosettaError  # noqa: E402
from rosetta_common.spec import Spec, SpecError  # noqa: E402


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


# The module each framework's environment is the one to import: what a hand-built environment is checked by.
FRAMEWORK_MODULES = {"torch": "torch", "tf": "tensorflow", "jax": "jax"}


def check_environment(stage: str, framework: str) -> None:
    """StageError (one line naming the environment to use) unless this process runs in `framework`'s environment:
    checked before the framework is imported or anything is written. The runner sets ROSETTA_ENV in every stage's
    environment; without it (a stage started by hand) the framework and its package must be importable here."""
    import importlib.util
    import os

    from rosetta_common.interface import BACKEND_MODULES

    needed = (f"{stage} {framework} must run in the {framework} environment "
              f"(python -m pipelines.runner {framework} -- ...)")
    current = os.environ.get("ROSETTA_ENV")
    if current:
        if current != framework:
            raise StageError(f"{needed}; this is the {current} environment")
        return
    for module in (FRAMEWORK_MODULES[framework], BACKEND_MODULES[framework]):
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise StageError(f"{needed}; this interpreter ({sys.executable}) cannot import {module}")


def framework_stage_args(argv: list[str], doc: str, stage: str) -> tuple[str, list[str], Spec]:
    """Parse `<framework> [<model> ...]` for a per-framework stage (no model: every model in params.yaml, in its
    order), check that it runs in that framework's environment (check_environment), and load params.yaml, which is
    validated (models included) before the stage writes anything."""
    from pipelines import paths
    from rosetta_common.interface import BACKEND_MODULES
    from rosetta_common.spec import load_spec

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("framework", choices=list(BACKEND_MODULES))
    parser.add_argument("models", nargs="*", metavar="model", help="default: every model in params.yaml")
    args = parser.parse_args(argv)
    check_environment(stage, args.framework)
    spec = load_spec(paths.PARAMS)
    for model in args.models:
        check_model(spec, model)
    return args.framework, list(dict.fromkeys(args.models)) or list(spec.models), spec
