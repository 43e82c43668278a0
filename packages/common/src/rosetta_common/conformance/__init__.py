"""The conformance suite: one set of tests that every framework package must pass, run in that framework's
own environment against its own package (as Keras 3 runs one suite against each backend).

    python -m pipelines.runner torch -- python -m pytest packages/common/src/rosetta_common/conformance

The runner sets ROSETTA_ENV to the environment's name, which picks the package (`ROSETTA_BACKEND` overrides
it). Tests are parametrized over every architecture in `rosetta_common.spec.ARCHITECTURES`, so a new
architecture is covered with no test edits. Framework test folders keep only what is specific to one
framework.
"""
