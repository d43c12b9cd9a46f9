"""The executor's errors: ``ParallelError``, which a model that cannot be parallelised as
asked raises wherever it is split (tensor-parallel plans, pipeline stages, data-parallel
hooks) or checked (tasks, the runner before any rank starts), and ``ExecutorError``, a
job that could not be started or continued."""

from __future__ import annotations

from autotune.errors import InputError

__all__ = ["ExecutorError", "ParallelError"]


class ParallelError(InputError):
    """A model that cannot be split as asked; the message says why and what to provide."""


class ExecutorError(RuntimeError):
    """The job could not be started or continued; the message says why."""
