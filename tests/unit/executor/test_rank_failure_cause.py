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


def test_the_copy_ray_get_raises_is_reported_from_rays_text() -> None:
    """``ray.get`` raises ``as_instanceof_cause()``: an instance of the cause's class that
    has lost the method and node fields, which Ray's first line still carries."""
    failure = ray.exceptions.RayTaskError(
        "RankWorker.step",
        "ray::RankWorker.step() (pid=4242, ip=198.18.0.3, actor_id=ab12, repr=<RankWorker>)\n"
        "  File ...\nRuntimeError: Connection closed by peer",
        RuntimeError("Connection closed by peer [198.18.0.2]:41234"),
        ip="198.18.0.3",
    ).as_instanceof_cause()
    assert isinstance(failure, RuntimeError)
    assert _cause(failure) == (
        "RankWorker.step on 198.18.0.3: RuntimeError: Connection closed by peer [198.18.0.2]:41234"
    )
