"""The error a model that cannot be parallelised as asked raises, wherever it is split
(tensor-parallel plans, pipeline stages, data-parallel hooks) or checked (tasks, the
runner before any rank starts)."""

from __future__ import annotations

from autotune.errors import InputError

__all__ = ["ParallelError"]


class ParallelError(InputError):
    """A model that cannot be split as asked; the message says why and what to provide."""
