"""bench/gpu_suite.sh --cpu-dry-run: every step of the GPU suite, tiny, on a CPU, with the
modules the GPU machine lacks made unimportable; one JSON out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils' timeout")
def test_the_gpu_suite_dry_run_writes_one_json_of_every_step(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "PYTHON": sys.executable,
        "TMPDIR": str(tmp_path),
        # the kernel tests in the dry run: a few, the whole set takes minutes here
        "GPU_SUITE_PYTEST_K": "test_helpers or chosen or emulated_path",
    }
    done = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_suite.sh"), "--cpu-dry-run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu_suite.json",
        "gpu_suite.log",
        "gpu_suite_junit.xml",
    ]
    report = json.loads((out / "gpu_suite.json").read_text())
    failed = [s for s in report["steps"] if not s["ok"]]
    assert not failed, json.dumps(failed, indent=1)
    assert [s["name"] for s in report["steps"]] == ["env", "tests", "kernels", "executor"]
    assert report["ok"] is True
    assert report["dry_run"] is True
    env_report = report["env"]
    assert all(r["ok"] for r in env_report["imports"].values()), env_report["imports"]
    assert all(str(tmp_path) in r["file"] for r in env_report["imports"].values())
    assert env_report["fp8_mode"] == "emulated"
    junit = report["tests"]["junit"]
    assert junit["tests"] > 0
    assert junit["failures"] == junit["errors"] == 0
    assert report["tests"]["progress"]["reports"] > 0
    kernels = report["kernels"]
    assert {r["kernel"] for r in kernels["rows"]} >= {"topk_compress", "quantize fp8_e4m3"}
    assert all(r["copy_bytes_per_s"] > 0 for r in kernels["rows"])
    assert kernels["goals"]
    assert all(g["met"] is None for g in kernels["goals"])  # a CPU decides nothing
    rows = report["executor"]["rows"]
    assert [r["config"] for r in rows] == [
        "gpt-tiny fp32",
        "gpt-tiny bf16",
        "gpt-tiny fp8 fp8=auto",
        "gpt-tiny fp8 fp8=scaled_mm",
    ]
    assert all("error" not in r for r in rows), rows
    assert [r["fp8_mode"] for r in rows] == [None, None, "emulated", "scaled_mm"]
    assert rows[3]["fp8_calls"]["scaled_mm"] > 0
    assert all(r["tokens_per_s"] > 0 and r["peak_memory_bytes"] > 0 for r in rows)
    assert "telemetry" in report
