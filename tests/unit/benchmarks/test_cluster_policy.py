"""The cluster-policy benchmark's plumbing: the user's jobs span every machine by
default, and a command that fails or prints no JSON stops it with the reason."""

from __future__ import annotations

import subprocess

import pytest

from autotune.benchmarks.cluster_policy import _args, _json_of


def test_the_default_jobs_span_every_machine() -> None:
    assert _args(["--machines", "3"]).task == ["gpt-char:3", "mlp-synthetic:3"]
    assert _args(["--task", "gpt-char:1-2"]).task == ["gpt-char:1-2"]


def test_a_failed_or_silent_command_stops_the_benchmark_with_its_reason() -> None:
    ok = subprocess.CompletedProcess([], 0, 'progress\n{"links": []}\n', "")
    assert _json_of(ok, "describe") == {"links": []}
    with pytest.raises(SystemExit, match=r"describe failed \(2\):\nno Ray"):
        _json_of(subprocess.CompletedProcess([], 2, "", "no Ray"), "describe")
    with pytest.raises(SystemExit, match="printed no JSON"):
        _json_of(subprocess.CompletedProcess([], 0, "done", ""), "describe")
