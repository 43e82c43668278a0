"""Rosetta's framework-neutral core: spec, data, canonical weights, metrics. Imports no framework.

The architectures and frameworks are rosetta_common.spec's ARCHITECTURES and FRAMEWORKS (from its types), the one
place they are listed."""

__version__ = "0.1.0"
