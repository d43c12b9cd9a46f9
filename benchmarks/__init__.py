"""The benchmarks behind ``bench/RESULTS.md``: each module measures one thing and has a
``main`` that ``python bench/<name>.py`` runs (the scripts in ``bench/`` are thin), so
that tests import them as any other module.

They are tools of a source checkout: they write under ``bench/out`` (``OUT``) and read
the public traces beside the checkout (``../shared/data``). Nothing of the product
imports them. ``bench/gpu_suite.py`` stays a script of its own: it assembles the package
on a machine where it is not installed, before anything can be imported.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any, Final

__all__ = ["OUT", "REPO", "postgres_bin", "publish"]

REPO: Final = Path(__file__).resolve().parents[1]
"""The source checkout (through an editable install's links)."""
OUT: Final = REPO / "bench" / "out"
"""Where the benchmarks write their JSON by default."""


def postgres_bin() -> Path | None:
    """Where ``pg_ctl`` and ``initdb`` are (Debian's postgresql package), if anywhere: for
    the throwaway PostgreSQL servers of tests and benchmarks."""
    import shutil

    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return candidates[-1].parent if candidates else None


def publish(benchmark: str, out: Path, figures: dict[str, Any]) -> dict[str, Any]:
    """``figures`` stamped with the benchmark's name, the date and the host, written as
    JSON to ``out`` (its folder made) and printed on one line; returns what was written."""
    result = {
        "benchmark": benchmark,
        "date": time.strftime("%Y-%m-%d"),
        "host": platform.processor() or platform.machine(),
        **figures,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return result
