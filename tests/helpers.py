"""Helpers shared by the tests."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
"""The repository's root."""
SHARED_DATA = REPO.parent / "shared" / "data"
"""The public traces, beside the checkout (absent on a bare clone: their tests skip)."""


def autotune_command() -> list[str]:
    """The installed ``autotune`` entry point, as a user runs it."""
    script = Path(sys.executable).parent / "autotune"
    return [str(script)] if script.exists() else [sys.executable, "-m", "autotune.cli"]
