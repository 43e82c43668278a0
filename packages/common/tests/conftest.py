import sys
from pathlib import Path

# common is not installed into the orchestrator environment; the runner puts it on PYTHONPATH for stages.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
