"""Markdown tables for the reports and benchmarks, through tabulate (GitHub's pipe format), so that no module builds
table syntax by hand."""

from __future__ import annotations

from collections.abc import Sequence


def markdown(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> str:
    """A pipe table of ``rows`` (cells already formatted as the report wants them: nothing is re-parsed as a number).

    Example: ``markdown([["sam", "1.03x"]], ["mode", "vs off"])`` gives a two-column table with one row."""
    from tabulate import tabulate

    return tabulate([[str(c) for c in r] for r in rows], headers=list(headers), tablefmt="pipe", disable_numparse=True)
