"""One look at a model server's V2 readiness from where it runs: inside its container, where its REST port is on
127.0.0.1 whatever network the container is on (pipelines/serving/containers.py runs it with `<engine> exec`).

    python -m pipelines.serving.probe http://127.0.0.1:8080 mlp mlp-init cnn cnn-init

Exit 0: `GET /v2/health/ready` and `GET /v2/models/<m>/ready` of every model named answer 200 (the same rule as
pipelines.serving.servers.wait_ready). Exit NOT_YET: nothing answers yet, or the server says it is not ready. Exit
1, one `error:` line: the server answers but does not serve a model named. Standard library and
pipelines.serving.servers only, so it runs in every image (the checkout is mounted and on PYTHONPATH there).
"""

from __future__ import annotations

import argparse
import sys

from pipelines.serving.servers import get

NOT_YET = 3  # neither success nor a refusal: the caller asks again until its bound


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the server's REST base, e.g. http://127.0.0.1:8080")
    parser.add_argument("models", nargs="+", metavar="MODEL", help="every model that must be ready")
    args = parser.parse_args(argv)
    status, answer = get(f"{args.url}/v2/health/ready", timeout=1.0)
    if status != 200:
        print(f"not ready: GET /v2/health/ready: {status or answer}", flush=True)
        return NOT_YET
    for model in args.models:
        status, answer = get(f"{args.url}/v2/models/{model}/ready")
        if status != 200 or not (isinstance(answer, dict) and answer.get("ready")):
            print(f"error: does not serve model {model!r} (GET /v2/models/{model}/ready: {status} {answer})",
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
