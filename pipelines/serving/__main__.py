"""`python -m pipelines.serving`: the model servers on the finished run's artifacts until Ctrl-C (servers.main)."""

from pipelines.serving.servers import main

raise SystemExit(main())
