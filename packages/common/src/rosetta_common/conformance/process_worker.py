"""One fresh process of the conformance suite's two-process checks: every architecture exported (export_worker),
then trained (train_worker), in one interpreter, as the pipeline's train_export stage does both in one process.

    python -m rosetta_common.conformance.process_worker <framework> <out_dir> hook|truncated

Started twice at the same time by conftest.py's `two_processes`: the exports must repeat byte for byte
(test_export.py) and the training bit for bit (test_training.py). One interpreter for both checks, not one each:
starting a framework (TF's import alone is seconds) was most of each check's cost. The exports come first, so
that both processes export from the same state whatever `mode` then trains (TF names what it traces from a
process-wide counter, so its export bytes follow what the process traced before).
"""

from __future__ import annotations

import sys
from pathlib import Path

from rosetta_common.conformance import export_worker, train_worker
from rosetta_common.io import write_json

EXPORTS = "exports"  # the exported files, one folder per architecture
DIGESTS = "digests.json"  # their sha256, by path under EXPORTS
RUN = "run.npz"  # train_worker's losses, weights and hook states


def main(framework: str, out: str, mode: str) -> None:
    folder = Path(out)
    write_json(folder / DIGESTS, export_worker.export_all(framework, folder / EXPORTS))
    train_worker.main(framework, str(folder / RUN), mode)


if __name__ == "__main__":
    main(*sys.argv[1:4])
