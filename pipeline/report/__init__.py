"""Plots of a run, read from its metrics.jsonl (matplotlib is imported only when plotting)."""

from pipeline.report.plots import load_metrics, write_report

__all__ = ["load_metrics", "write_report"]
