"""The artifact comparison report: reads what the pipeline's lineage holds (each run's folder under artifacts/,
reports/validation.json) and renders reports/comparison/ (report.html, report.md, summary/, plots/).

Runs in the orchestrator environment: it never imports a framework or ONNX Runtime, only reads files. Its output
is a pure function of its inputs, byte for byte: no dates, no timings, no absolute paths. Measurements of a run
(measurements/, not lineage) are never read here; report.html loads them in the browser, marked as this run's.
"""
