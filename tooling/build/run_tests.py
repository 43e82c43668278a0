"""`make test`: the three framework suites, one after another, each in its own environment, side by side with the
cross-cutting suite in the orchestrator's, itself on two pytest-xdist workers (CROSS_WORKERS).

Why side by side: most of both is one Python thread (pytest, DVC, interpreters starting, small models training)
or a wait (a coordinator that never answers, a held stage, a server starting), so on 2 cores the streams
overlap instead of queueing. Nothing is shared between them but JAX's compilation cache (suite_environment): each
pytest session has its own base temporary folder, every port is chosen free at start, the framework suites touch
no pipeline copy, and each cross-cutting worker changes only its own copy of the tiny run.

The cross-cutting suite prints live (its progress is the long one); each framework suite's output goes to
`.rosetta/tests/<framework>.log` and is printed whole when it ends, with a one-line verdict. The exit status is
non-zero when any suite failed.

    python -m tooling.build.run_tests [all|frameworks|cross]   (make test, make test-frameworks, make test-cross)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TextIO

from pipelines.environments import REPO_ROOT
from rosetta_common.registry import ARCHITECTURES, SpecError
from rosetta_common.testing import MODELS_VARIABLE, models_under_test

FRAMEWORKS = ("torch", "tf", "jax")
CONFORMANCE = "packages/common/src/rosetta_common/conformance"
LOGS = REPO_ROOT / ".rosetta/tests"


def framework_suite(framework: str, basetemp: Path) -> list[str]:
    """The conformance suite and the framework's own tests, in its environment, through the pipeline's runner."""
    return [sys.executable, "-m", "pipelines.runner", framework, "--", "python", "-m", "pytest", "-q",
            "--durations=15", f"--basetemp={basetemp / framework}", CONFORMANCE, f"packages/{framework}_impl/tests"]


# The cross-cutting suite's pytest-xdist workers. Most of its time is one Python thread driving a subprocess (DVC,
# a stage, a server) or waiting on one, so on 2 cores two workers beside the framework suites keep both cores
# busy where one left the second idle once the framework suites ended. Each test file runs whole on one worker
# (tests/conftest.py, pytest_xdist_make_scheduler); the tiny run is made once and copied to each
# (tooling/build/tiny_run.shared_tiny_pipeline). ROSETTA_TEST_WORKERS changes the count (0: one pytest process, as
# before; a machine with more cores may want more).
CROSS_WORKERS = 2


def cross_workers() -> int:
    value = os.environ.get("ROSETTA_TEST_WORKERS", str(CROSS_WORKERS))
    if not value.isdigit():
        raise SystemExit(f"error: ROSETTA_TEST_WORKERS={value!r}: must be a whole number of workers, 0 or more")
    return int(value)


def cross_suite(basetemp: Path) -> list[str]:
    """`packages/common/tests` and `tests/` (pyproject.toml's testpaths) in the orchestrator's environment."""
    return [sys.executable, "-m", "pytest", "-q", "--durations=40", f"--basetemp={basetemp / 'cross'}",
            "-n", str(cross_workers())]


def suite_environment(basetemp: Path) -> dict[str, str]:
    """What every suite's processes see besides the caller's environment.

    One JAX compilation cache for the whole run (JAX's own persistent cache, empty at the start, in the run's
    temporary folder): the suites start hundreds of JAX processes (stages, workers, servers, planted copies) that
    compile the same programs; each is now compiled once per run. The key holds the program, jaxlib's version,
    the XLA flags (the ISA cap and thread count among them) and the compile options, so a process whose flags
    differ compiles its own. Measured on the jax suite alone: 193 s without, 156 s starting empty, 86 s warm.
    Every byte-for-byte check across processes still holds (a compiled and a loaded program give the same bits).

    OpenMP's idle threads sleep instead of spinning (OMP_WAIT_POLICY=PASSIVE; torch's pools are OpenMP's): the
    suites run three or more busy processes on 2 cores, each with OMP_NUM_THREADS threads, and a spinning thread
    takes the core another process needs. How threads wait changes no result, only the time. Measured, fresh clones
    of the same code one after the other: `make test` 1,172 s and 1,965 + 144 CPU-s with it, 1,349-1,357 s and
    2,195-2,218 + 137 CPU-s without (alone, where nothing contends, the torch suite took 129 s with it against 122 s).
    Only the tests' processes (the stages they run included) get it; a user's `dvc repro`, one stage at a time,
    keeps OpenMP's default."""
    return {"JAX_COMPILATION_CACHE_DIR": str(basetemp / "jax-cache"),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
            "OMP_WAIT_POLICY": "PASSIVE"}


RUNNING: list[subprocess.Popen] = []  # the suites' processes, stopped if the run is interrupted
SUMMARIES: dict[str, str] = {}  # each suite's own pytest summary ("600 passed, 9 skipped in 1981.99s")
SUMMARY = re.compile(r"^=* *(\d+ (?:passed|failed|error|errors|skipped|deselected)\b.* in [\d.]+s.*?) *=*$")


def run(name: str, cmd: list[str], sink: TextIO) -> int:
    """Run one suite, its output (stdout and stderr) line by line into `sink`, keeping pytest's summary line."""
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    RUNNING.append(proc)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            sink.write(line)
            sink.flush()
            if found := SUMMARY.match(line.strip()):
                SUMMARIES[name] = found.group(1)
        return proc.wait()
    finally:
        RUNNING.remove(proc)


def run_frameworks(basetemp: Path, results: dict[str, int], echo: bool) -> None:
    """Each framework suite in turn; with `echo`, its output live, otherwise into its log, printed when it ends."""
    LOGS.mkdir(parents=True, exist_ok=True)
    for framework in FRAMEWORKS:
        started = time.monotonic()
        if echo:
            results[framework] = run(framework, framework_suite(framework, basetemp), sys.stdout)
        else:
            log = LOGS / f"{framework}.log"
            with log.open("w") as out:
                results[framework] = run(framework, framework_suite(framework, basetemp), out)
            print(f"\n---------- {framework} suite ({log.relative_to(REPO_ROOT)}) ----------\n{log.read_text()}",
                  flush=True)
        verdict = "passed" if results[framework] == 0 else f"FAILED (exit {results[framework]})"
        print(f"[run_tests] {framework} suite {verdict} in {time.monotonic() - started:.0f} s", flush=True)


def totals(names: list[str]) -> str:
    """The suites' pytest summaries added up, as pytest words its own: "1461 passed, 9 skipped"."""
    counts: dict[str, int] = {}
    for name in names:
        for number, word in re.findall(r"(\d+) (\w+)", SUMMARIES.get(name, "").split(" in ")[0]):
            counts[word] = counts.get(word, 0) + int(number)
    return ", ".join(f"{n} {word}" for word, n in counts.items()) or "no summary"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("which", nargs="?", default="all", choices=["all", "frameworks", "cross", "model"])
    parser.add_argument("--model", default="", help="model: the architectures under test (ROSETTA_TEST_MODELS)")
    args = parser.parse_args(argv)
    which = args.which
    cross_workers()  # a bad ROSETTA_TEST_WORKERS is one line before anything starts
    if which == "model":  # one model's tests in every environment: an unknown name is one line
        try:
            os.environ[MODELS_VARIABLE] = " ".join(models_under_test({MODELS_VARIABLE: args.model}))
        except SpecError:
            raise SystemExit(f"error: MODEL = {args.model!r}: not a registered architecture; allowed: "
                             f"{', '.join(ARCHITECTURES)}") from None
        if not args.model.strip():
            raise SystemExit(f"error: MODEL = '': name one or more of {', '.join(ARCHITECTURES)}")
    results: dict[str, int] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rosetta-tests-") as tmp:
        basetemp = Path(tmp)
        os.environ.update(suite_environment(basetemp))  # every suite's processes inherit it
        try:
            if which == "frameworks":
                run_frameworks(basetemp, results, echo=True)
            elif which == "model":
                run_frameworks(basetemp, results, echo=True)
                results["cross"] = run("cross", [sys.executable, "-m", "pytest", "-q", "packages/common/tests"],
                                       sys.stdout)
            elif which == "cross":
                results["cross"] = run("cross", cross_suite(basetemp), sys.stdout)
            else:
                beside = threading.Thread(target=run_frameworks, args=(basetemp, results, False), daemon=True)
                beside.start()
                results["cross"] = run("cross", cross_suite(basetemp), sys.stdout)
                print("[run_tests] cross-cutting suite "
                      f"{'passed' if results['cross'] == 0 else 'FAILED'} in {time.monotonic() - started:.0f} s; "
                      "waiting for the framework suites", flush=True)
                beside.join()
        except KeyboardInterrupt:
            for proc in list(RUNNING):
                proc.terminate()
            for proc in list(RUNNING):
                proc.wait()
            print("[run_tests] interrupted", file=sys.stderr)
            return 130
    failed = [name for name in (*FRAMEWORKS, "cross") if name in results and results[name] != 0]
    missing = [name for name in FRAMEWORKS if which != "cross" and name not in results]
    names = [name for name in (*FRAMEWORKS, "cross") if name in results]
    each = "; ".join(f"{name}: {SUMMARIES.get(name, 'no summary')}" for name in names)
    verdict = "FAILED: " + ", ".join(failed + missing) + "; " if failed or missing else ""
    # Last, in pytest's own words: every suite's counts added up, then each suite's summary.
    print(f"========== {verdict}{totals(names)} in {time.monotonic() - started:.0f}s ({each}) ==========", flush=True)
    return 1 if failed or missing else 0


if __name__ == "__main__":
    os.chdir(REPO_ROOT)
    sys.exit(main())
