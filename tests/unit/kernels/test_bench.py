"""bench/kernels.py runs on a CPU and prints its table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO


@pytest.mark.subprocess
def test_the_kernel_benchmark_prints_a_row_per_kernel(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "kernels.py"),
            "--device",
            "cpu",
            "--sizes",
            "4K,8K",
            "--repeat",
            "1",
            "--json",
            str(tmp_path / "kernels.json"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4K elements: topk_compress" in done.stderr  # progress
    assert "the kernel column is the pure-torch reference path" in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "ms" not in line]
    kernels = {line.split("|")[1].strip() for line in rows}
    assert kernels == {
        "topk_compress",
        "scatter_add_decompress",
        "quantize int8",
        "dequantize int8",
        "quantize fp8_e4m3",
        "dequantize fp8_e4m3",
        "layernorm_gelu fwd",
        "layernorm_gelu fwd+bwd",
    }
    assert len(rows) == 16
    report = json.loads((tmp_path / "kernels.json").read_text())
    assert report["peak_source"].startswith("CPU: measured tensor copy")
    assert all(row["backend"] == "reference" and row["kernel_ms"] > 0 for row in report["rows"])
