"""Helpers shared by the tests."""

from __future__ import annotations

import sys
from pathlib import Path


def autotune_command() -> list[str]:
    """The installed ``autotune`` entry point, as a user runs it."""
    script = Path(sys.executable).parent / "autotune"
    return [str(script)] if script.exists() else [sys.executable, "-m", "autotune.cli"]
