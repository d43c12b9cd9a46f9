"""Tensor parallelism: which ``nn.Linear`` layers are sharded how, and the sharding.

Tensor parallelism goes through ``DeviceMesh`` + ``parallelize_module``. The plan comes
from the task's ``tp_plan()`` or is derived for the common patterns: attention whose
q/k/v/out projections are separate ``nn.Linear`` children (column-wise q/k/v, row-wise
out) and feed-forward pairs of consecutive ``nn.Linear`` children that widen then narrow
(``nn.TransformerEncoderLayer``'s ``linear1``/``linear2``, GPT MLPs). The model's
forward must infer the number of local heads from the width (``view(b, t, -1, d)``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from torch import nn

from autotune.executor.errors import ParallelError

__all__ = ["apply_tensor_parallel", "derive_tp_plan"]

_QKV_NAMES = (
    ("q_proj", "k_proj", "v_proj"),
    ("query", "key", "value"),
    ("wq", "wk", "wv"),
    ("q", "k", "v"),
)
_OUT_NAMES = ("out_proj", "o_proj", "wo", "out", "c_proj", "proj", "dense")


def _linear_children(module: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(n, c) for n, c in module.named_children() if isinstance(c, nn.Linear)]


def derive_tp_plan(model: nn.Module) -> dict[str, str]:
    """Module name -> ``"colwise"`` | ``"rowwise"`` for the patterns the module docstring
    lists; empty when none is found."""
    plan: dict[str, str] = {}
    for prefix, module in model.named_modules():
        linears = _linear_children(module)
        names = {n for n, _ in linears}
        dot = f"{prefix}." if prefix else ""
        qkv = next((group for group in _QKV_NAMES if set(group) <= names), None)
        if qkv is not None:
            out = next((n for n in _OUT_NAMES if n in names), None)
            if out is not None:
                for n in qkv:
                    plan[dot + n] = "colwise"
                plan[dot + out] = "rowwise"
                continue
        for (n1, l1), (n2, l2) in itertools.pairwise(linears):
            if dot + n1 in plan or dot + n2 in plan:
                continue
            widens = l1.out_features > l1.in_features
            if widens and l1.out_features == l2.in_features and l2.out_features == l1.in_features:
                plan[dot + n1] = "colwise"
                plan[dot + n2] = "rowwise"
    return plan


def _check_tp_plan(model: nn.Module, plan: dict[str, Any], tp: int) -> None:
    modules = dict(model.named_modules())
    for name, style in plan.items():
        module = modules.get(name)
        if module is None:
            raise ParallelError(f"tensor-parallel plan names {name!r}, which the model lacks")
        if isinstance(module, nn.Linear) and isinstance(style, str):
            width = module.out_features if style == "colwise" else module.in_features
            if width % tp:
                raise ParallelError(
                    f"cannot shard {name} {style} over {tp} ranks: width {width} is not divisible"
                )


def apply_tensor_parallel(
    model: nn.Module,
    mesh: Any,
    plan: dict[str, Any] | None,
    *,
    keep: Callable[[str], bool] | None = None,
) -> dict[str, str]:
    """Shard ``model`` in place over the 1-D ``mesh``; returns the plan used. With
    ``keep``, only the modules it accepts are sharded (a pipeline stage's own: the others
    hold no storage); the plan is checked whole first."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    chosen = dict(plan) if plan is not None else derive_tp_plan(model)
    if not chosen:
        raise ParallelError(
            f"cannot split {type(model).__name__} for tensor parallelism: no separate q/k/v/out "
            "projections and no widening/narrowing nn.Linear pair found; give the task a "
            "tp_plan() (module name -> 'colwise' | 'rowwise')"
        )
    tp = mesh.size()
    _check_tp_plan(model, chosen, tp)
    if keep is not None:
        chosen = {name: style for name, style in chosen.items() if keep(name)}
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    resolved = {}
    for name, style in chosen.items():
        if isinstance(style, str):
            if style not in styles:
                raise ParallelError(
                    f"tensor-parallel style {style!r} for {name}: use colwise|rowwise"
                )
            resolved[name] = styles[style]()
        else:
            resolved[name] = style
    if resolved:
        parallelize_module(model, mesh, resolved)
    return {n: s if isinstance(s, str) else type(s).__name__ for n, s in chosen.items()}
