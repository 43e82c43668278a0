"""Rosetta in PyTorch: the Backend interface of rosetta_common.interface, built from models.py, weights.py,
train.py and export.py."""

FRAMEWORK = "torch"
