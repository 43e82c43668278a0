"""Rosetta's orchestration: stage entry points and the runner that executes them in isolated environments."""
