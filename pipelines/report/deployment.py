"""The report's Deployment section: what each export format needs to be deployed (documented facts, with their
sources: pipelines/deployment_formats.py), rendered at build time in both report.html and report.md.

The measured half (file size, cold start, latency, environment size: benchmarks/deployment.py) is a measurement of
one machine, so report.html draws it in the browser from measurements/timings.js (window.ROSETTA_DEPLOYMENT) into
the section's #deployment-measured, as every other measurement; nothing here reads measurements/."""

from __future__ import annotations

from pipelines.deployment_formats import FORMATS, NOT_MEASURED
from pipelines.report.tables import Cell, Column, Row, Table

TITLE = "Deployment: the export formats side by side"
NOTE = ("Each export format a run ships, as a deployment target: whether serving it needs Python, whether loading it "
        "needs the model's own code, which servers and runtimes load it, and what Rosetta serves it with. Measured "
        "figures (file size, cold start in a fresh process, steady latency at batch 1 and 64, the environment's size "
        "on disk), when benchmarks/deployment.py has run on this machine, are drawn below the table by report.html.")


def facts_table() -> Table:
    rows = [Row([Cell(f.name, mono=True, header=True), Cell(f.file if f.framework != "*" else f"{f.file} (each)",
                                                           mono=True),
                 Cell(f.env), Cell(f.imports, mono=True), Cell(f.python), Cell(f.model_code), Cell(f.servers),
                 Cell(f.rosetta), Cell("", lines=f.sources)])
            for f in FORMATS]
    columns = [Column(label, left=True) for label in (
        "format", "file in the run folder", "environment", "a process imports", "needs Python to serve",
        "needs the model's code", "loaded by (documented)", "Rosetta serves it with", "sources")]
    note = ("Verified by Rosetta: each file loads and answers in a fresh process importing only the modules named "
            "(the benchmark records the modules it found loaded), and Rosetta's servers answer bit for bit as the "
            "same export in process. The rest is documented by the sources, not run by Rosetta. Not measured: "
            + "; ".join(f"{name}: {why}" for name, why in NOT_MEASURED.items()) + ".")
    return Table("Export formats as deployment targets", columns, rows, note=note)
