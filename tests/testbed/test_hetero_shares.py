"""Uneven batch shares and pipeline stages on testbed machines of different speeds (CPU
quotas): the benchmark's arms run rank i on machine i, the by-speed shares and stage cuts
follow the machines' quotas, and the losses are the even ones' (``bench/hetero_shares.py``;
its throughput figures are measured on a quiet host: bench/RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.benchmarks import REPO

pytestmark = [pytest.mark.testbed, pytest.mark.usefixtures("testbed_host")]


def _bench(tmp_path: Path, *args: str, steps: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``bench/hetero_shares.py`` on two machines (1 and 0.5 CPUs), arms even and
    by-speed, one seed: its JSON and its runs by arm, each checked to have put rank i on
    machine i and trained ``steps`` steps."""
    out = tmp_path / "hetero.json"
    argv = [
        sys.executable, str(REPO / "bench" / "hetero_shares.py"), *args,
        "--steps", str(steps), "--warmup", "2", "--seeds", "0", "--json", str(out),
    ]  # fmt: skip
    # A process of its own: a Ray driver of the testbed, which reads the testbed's token
    # settings when Ray is imported (this one may be a driver of the tests' Ray already).
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {r["arm"]: r for r in result["runs"]}
    assert set(rows) == {"even", "by-speed"}
    for row in rows.values():
        assert [p["rank"] for p in row["placement"]] == [0, 1]
        assert len({p["node"] for p in row["placement"]}) == 2
        assert row["steps"] == steps
    return result, rows


def test_shares_by_speed_train_as_even_shares_on_machines_of_two_speeds(tmp_path: Path) -> None:
    result, rows = _bench(
        tmp_path, "--tasks", "mlp-synthetic", "--batch", "1024", "--arms", "even", "by-speed",
        steps=12,
    )  # fmt: skip
    assert rows["by-speed"]["shares"] == [683, 341]  # 1 : 0.5 of 1024
    summary = result["summary"]["mlp-synthetic"]
    assert summary["by-speed"]["max_loss_gap_to_even"] < 1e-3


def test_stages_cut_by_speed_train_as_even_stages_on_machines_of_two_speeds(
    tmp_path: Path,
) -> None:
    """``--layout pp``: stage i on machine i, the block stack cut 3:1 by the machines'
    speeds (1 and 0.5 of 4 blocks), the same losses as the even cut."""
    result, rows = _bench(
        tmp_path, "--layout", "pp", "--tasks", "gpt-char", "--batch", "16", steps=6
    )
    assert rows["by-speed"]["stage_weights"] == [1.0, 0.5]
    assert rows["even"]["stage_weights"] is None
    assert result["summary"]["gpt-char"]["by-speed"]["max_loss_gap_to_even"] < 1e-4
