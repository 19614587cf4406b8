"""Markdown table rows for the report's sections."""

from __future__ import annotations

from typing import Any


def row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def rule(*aligns: str) -> str:
    return row(*("---:" if a == "r" else "---" for a in aligns))


def ms(summary: dict[str, Any]) -> str:
    """p50 / p99 in milliseconds."""
    return f"{summary['p50_ms']:.1f} / {summary['p99_ms']:.1f}"


def rate(run: dict[str, Any]) -> str:
    """p50 / p99 in milliseconds, and the answers a second, of a load run."""
    return f"{ms(run)} ({run['throughput_per_second']:.1f}/s)"
