import sys
from pathlib import Path

# support.py (shared helpers) sits beside the tests; common and pipelines come from this checkout.
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1] / "packages/common/src")]
