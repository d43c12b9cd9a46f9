"""A rank that fails while starting is reported with its cause, not Ray's first line."""

from __future__ import annotations

import ray

from autotune.executor.runner import _cause


def test_a_rank_exception_is_reported_with_its_type_message_and_node() -> None:
    failure = ray.exceptions.RayTaskError(
        "RankWorker.setup",
        "Traceback (most recent call last):\n  ...\nRuntimeError: Connection refused",
        RuntimeError("[gloo] connect to 127.0.0.1:41234 failed: Connection refused\nmore"),
        ip="198.18.0.2",
    )
    text = _cause(failure)
    assert text == (
        "RankWorker.setup on 198.18.0.2: RuntimeError: "
        "[gloo] connect to 127.0.0.1:41234 failed: Connection refused"
    )


def test_other_errors_keep_their_first_line() -> None:
    assert _cause(ValueError("first\nsecond")) == "first"
