"""The validate stage's checks, one small module per kind: the ledger every check writes to (and the check names
the report reads), ONNX Runtime sessions, artifact integrity, inference mode, one framework's exports, the
pairwise figures (framework pairs, data-parallel pairs, the GPU check), and the data-parallel runs.
pipelines/stages/validate.py is the stage's entry point; it calls these in order."""
