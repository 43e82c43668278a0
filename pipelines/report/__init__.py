"""The artifact comparison report: reads what the pipeline wrote (metrics, train logs, export records, ONNX
files, reports/validation.json, reports/latency) and renders reports/report.html and reports/report.md.

Runs in the orchestrator environment: it never imports a framework or ONNX Runtime, only reads files.
"""
