"""Making a rank's model parallel: activation checkpointing of its blocks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

__all__ = ["apply_activation_checkpointing"]


def apply_activation_checkpointing(blocks: nn.ModuleList) -> None:
    """Recompute each block's activations in the backward pass."""
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        inner: Callable[..., Any] = block.forward

        def forward(*args: Any, _inner: Callable[..., Any] = inner, **kwargs: Any) -> Any:
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        block.forward = forward
