"""Tensor- and pipeline-parallel splitting of a task's model.

Tensor parallelism goes through ``DeviceMesh`` + ``parallelize_module``. The plan comes
from the task's ``tp_plan()`` or is derived for the common patterns: attention whose
q/k/v/out projections are separate ``nn.Linear`` children (column-wise q/k/v, row-wise
out) and feed-forward pairs of consecutive ``nn.Linear`` children that widen then narrow
(``nn.TransformerEncoderLayer``'s ``linear1``/``linear2``, GPT MLPs). The model's
forward must infer the number of local heads from the width (``view(b, t, -1, d)``).

Pipeline parallelism goes through ``torch.distributed.pipelining``. Stages begin at the
task's ``split_points()`` or at even cuts of the model's largest stack of identical
blocks (an ``nn.ModuleList``, as in ``nn.TransformerEncoder.layers``). Every stage holds
the model; blocks outside its range pass their input through, the first block of a later
stage takes the received activation in place of its input, and the last block of an
earlier stage ends the forward and sends its output. Parameters outside a stage's blocks
(embeddings, final norm, head) are trained by the stage that uses them.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from autotune.errors import InputError

__all__ = [
    "ParallelError",
    "StageModule",
    "apply_activation_checkpointing",
    "apply_tensor_parallel",
    "derive_split_points",
    "derive_tp_plan",
    "find_blocks",
    "replay",
    "stage_ranges",
]

_QKV_NAMES = (
    ("q_proj", "k_proj", "v_proj"),
    ("query", "key", "value"),
    ("wq", "wk", "wv"),
    ("q", "k", "v"),
)
_OUT_NAMES = ("out_proj", "o_proj", "wo", "out", "c_proj", "proj", "dense")


class ParallelError(InputError):
    """A model that cannot be split as asked; the message says why and what to provide."""


# --------------------------------------------------------------------------------------
# Tensor parallelism
# --------------------------------------------------------------------------------------


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
    model: nn.Module, mesh: Any, plan: dict[str, Any] | None
) -> dict[str, str]:
    """Shard ``model`` in place over the 1-D ``mesh``; returns the plan used."""
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
    parallelize_module(model, mesh, resolved)
    return {n: s if isinstance(s, str) else type(s).__name__ for n, s in chosen.items()}


# --------------------------------------------------------------------------------------
# Blocks, pipeline stages, activation checkpointing
# --------------------------------------------------------------------------------------


def find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The largest ``nn.ModuleList`` of at least two modules of one class."""
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) >= 2:
            if len({type(m) for m in module}) != 1:
                continue
            size = sum(p.numel() for p in module.parameters())
            if best is None or size > best[0]:
                best = (size, name, module)
    if best is None:
        raise ParallelError(
            f"cannot find a stack of blocks in {type(model).__name__} (an nn.ModuleList of "
            "identical modules, as nn.TransformerEncoder has): give the task split_points()"
        )
    return best[1], best[2]


def derive_split_points(model: nn.Module, stages: int) -> list[str]:
    """Names of the blocks where stages ``1..stages-1`` begin: even cuts of the stack."""
    name, blocks = find_blocks(model)
    if len(blocks) < stages:
        raise ParallelError(
            f"cannot split {len(blocks)} blocks ({name}) into {stages} pipeline stages"
        )
    cuts = [round(i * len(blocks) / stages) for i in range(1, stages)]
    return [f"{name}.{c}" for c in cuts]


def stage_ranges(
    model: nn.Module, split_points: Sequence[str], stages: int
) -> tuple[str, list[range]]:
    """The block stack's name and each stage's range of block indices."""
    if len(split_points) != stages - 1:
        raise ParallelError(
            f"{stages} pipeline stages need {stages - 1} split points, got {list(split_points)}"
        )
    parents, cuts = set(), []
    for point in split_points:
        match = re.fullmatch(r"(.+)\.(\d+)", point)
        if match is None:
            raise ParallelError(f"split point {point!r} is not '<module list>.<index>'")
        parents.add(match.group(1))
        cuts.append(int(match.group(2)))
    if len(parents) != 1:
        raise ParallelError(f"split points {list(split_points)} span several module lists")
    parent = parents.pop()
    blocks = dict(model.named_modules()).get(parent)
    if not isinstance(blocks, nn.ModuleList):
        raise ParallelError(f"split points name {parent!r}, which is not an nn.ModuleList")
    bounds = [0, *cuts, len(blocks)]
    if any(b >= a for a, b in zip(bounds[1:], bounds, strict=False)):
        raise ParallelError(
            f"split points {list(split_points)} must be increasing and inside 1..{len(blocks) - 1}"
        )
    return parent, [range(a, b) for a, b in itertools.pairwise(bounds)]


def _passthrough(x: Any, *args: Any, **kwargs: Any) -> Any:
    return x


@dataclass
class _StageExit(Exception):  # noqa: N818 - control flow, not an error
    output: Tensor


class StageModule(nn.Module):
    """One pipeline stage over a whole model (see the module docstring)."""

    def __init__(self, model: nn.Module, blocks: nn.ModuleList, span: range, *, last: bool) -> None:
        super().__init__()
        self.model = model
        self.first = span.start == 0
        self.last = last
        self.template: Tensor | None = None
        """An input of the model's shape, for stages after the first: what the layers
        before the stage's blocks compute from it is replaced by the received activation."""
        self._received: Tensor | None = None
        for index, block in enumerate(blocks):
            if index not in span:
                block.forward = _passthrough
        if not self.first:
            blocks[span.start].register_forward_pre_hook(self._inject)
        if not last:
            blocks[span.stop - 1].register_forward_hook(self._exit)

    def _inject(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        assert self._received is not None
        return (self._received, *args[1:])

    def _exit(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        raise _StageExit(output)

    def forward(self, x: Tensor) -> Tensor:
        if self.first:
            inputs = x
        else:
            if self.template is None:
                raise RuntimeError("a later pipeline stage needs its input template set")
            inputs, self._received = self.template, x
        try:
            out: Tensor = self.model(inputs)
            return out
        except _StageExit as stop:
            return stop.output
        finally:
            self._received = None


def apply_activation_checkpointing(blocks: nn.ModuleList) -> None:
    """Recompute each block's activations in the backward pass."""
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        inner: Callable[..., Any] = block.forward

        def forward(*args: Any, _inner: Callable[..., Any] = inner, **kwargs: Any) -> Any:
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        block.forward = forward


def replay(output: Tensor) -> nn.Module:
    """A module that returns ``output`` whatever it is called with: lets the last stage
    evaluate a task's ``loss(model, batch)`` on the output the pipeline computed."""
    return _Replay(output)


class _Replay(nn.Module):
    def __init__(self, output: Tensor) -> None:
        super().__init__()
        self.output = output

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        return self.output
