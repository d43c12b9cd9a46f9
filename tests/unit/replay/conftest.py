"""The logged run the replay tests share (``replay_log``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from replay_log import TICKS, run_daemon

from autotune.daemon.tick import Daemon
from autotune.replay.export import export


@pytest.fixture(scope="session")
def logged_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Daemon]:
    """(database URL, export folder, the stopped daemon) of a run of ``TICKS`` rounds."""
    root = tmp_path_factory.mktemp("logged")
    url = f"sqlite:///{root / 'daemon.db'}"
    daemon = run_daemon(url, ticks=TICKS)
    out = root / "export"
    export(url, out)
    return url, out, daemon
