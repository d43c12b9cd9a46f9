"""The testbed's links behave like a network of their bandwidth: all-reduce of known bytes
and a dense data-parallel step across machines, against the bound 2·(n−1)/n·bytes/rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.benchmarks import testbed_links

pytestmark = [pytest.mark.testbed, pytest.mark.usefixtures("testbed_host")]


def test_ring_bound() -> None:
    # 2 ranks: each sends the whole buffer once; 4 ranks: 1.5 times.
    assert testbed_links.ring_bound_s(12.5e6, 2, 100) == pytest.approx(1.0)
    assert testbed_links.ring_bound_s(12.5e6, 4, 100) == pytest.approx(1.5)


def test_all_reduce_and_a_dense_step_take_the_links_time(tmp_path: Path) -> None:
    out = tmp_path / "links.json"
    argv = ["--sizes-mib", "2", "--steps", "20", "--json", str(out)]
    testbed_links.main(argv)  # its exit status says whether every goal was met
    result = json.loads(out.read_text())
    (reduce,) = result["all_reduce"]
    # The all-reduce of known bytes: the 20% goal itself (measured alone, it is steady).
    assert reduce["ratio"] == pytest.approx(1.0, abs=0.2), result
    training = result["training"]
    assert len(training["nodes"]) == 2
    # The step's all-reduce is the difference of two medians of 20 steps (shaped link
    # minus unshaped), and on a shared CI host the unshaped steps vary by half their
    # time: checked here for the link's share of the step, while the 20% goals are
    # measured by the benchmark on a quiet host (bench/RESULTS.md: 0.90 and 0.92).
    assert training["all_reduce_ratio"] == pytest.approx(1.0, abs=0.4), training
    assert training["step_over_compute_plus_bound"] == pytest.approx(1.0, abs=0.3), training
    # Top-k 1% sends a few percent of the bytes, so its step is far shorter on this link.
    assert training["step_s_topk1pct_shaped"] < 0.6 * training["step_s_dense_shaped"]
