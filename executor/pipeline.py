"""Pipeline parallelism: a stage's forward over the model's whole module tree, and the
schedule that runs the stages (``torch.distributed.pipelining``'s GPipe).

Each stage keeps the whole module tree (the names the checkpoints, the tensor-parallel
plan and the precision classes use), and runs the model's own forward: blocks outside
its range pass their input through, the first block of a later stage takes the received
activation in place of its input, and the last block of an earlier stage ends the
forward and sends its output. A later stage runs what comes before its first block on
``meta`` tensors (a shape-only template of the input, under ``torch.device("meta")``):
it costs no memory and no arithmetic. So a model's forward may compute between the
block stack's start and a stage's first block only from the input and the parameters;
what it passes to a block besides the activation (a mask) must not be needed by a later
stage.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from autotune.executor.errors import ParallelError
from autotune.executor.stage_plan import StagePlan

__all__ = ["StageModule", "build_schedule", "replay", "stage_module"]


def _passthrough(x: Any, *args: Any, **kwargs: Any) -> Any:
    return x


@dataclass
class _StageExit(Exception):  # noqa: N818 - control flow, not an error
    output: Tensor


class StageModule(nn.Module):
    """One pipeline stage over the model's whole module tree (see the module docstring).

    ``prefix_context()``, when given, is entered while a later stage runs what comes
    before its first block on ``meta`` (the worker turns precision handling off there).
    """

    def __init__(
        self,
        model: nn.Module,
        blocks: nn.ModuleList,
        span: range,
        *,
        last: bool,
        prefix_context: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.span = span
        """The indices of the blocks this stage runs."""
        self.own_blocks = tuple(blocks[i] for i in span)
        """The blocks this stage runs (a tuple: not registered as submodules again)."""
        self.first = span.start == 0
        self.last = last
        self.prefix_context = prefix_context
        self.template: Tensor | None = None
        """An input of the model's shape and dtype, for stages after the first: what the
        layers before the stage's blocks compute from it (on ``meta``) is replaced by the
        received activation."""
        self._received: Tensor | None = None
        self._prefix: ExitStack | None = None
        self._first_block = f"block {span.start}"
        for index, block in enumerate(blocks):
            if index not in span:
                block.forward = _passthrough
        if not self.first:
            blocks[span.start].register_forward_pre_hook(self._inject)
        if not last:
            blocks[span.stop - 1].register_forward_hook(self._exit)

    def _end_prefix(self) -> None:
        prefix, self._prefix = self._prefix, None
        if prefix is not None:
            prefix.close()

    def _inject(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        assert self._received is not None
        self._end_prefix()
        if any(isinstance(a, Tensor) and a.is_meta for a in args[1:]):
            raise ParallelError(
                f"the model passes its blocks more than the activation: a later pipeline "
                f"stage's {self._first_block} would get tensors computed before the "
                "blocks, which that stage does not run"
            )
        return (self._received, *args[1:])

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        raise _StageExit(output)

    def forward(self, x: Tensor) -> Tensor:
        if self.first:
            inputs = x
        else:
            if self.template is None:
                raise RuntimeError("a later pipeline stage needs its input template set")
            inputs = torch.empty_like(self.template, device="meta")
            self._received = x
            self._prefix = ExitStack()
            self._prefix.enter_context(torch.device("meta"))
            if self.prefix_context is not None:
                self._prefix.enter_context(self.prefix_context())
        try:
            out: Tensor = self.model(inputs)
        except _StageExit as stop:
            out = stop.output
        finally:
            self._end_prefix()
            self._received = None
        if isinstance(out, Tensor) and out.is_meta:
            raise ParallelError(
                "a pipeline stage's output was computed on meta: the model's forward uses, "
                "after the stage's blocks, something computed before them (a skip "
                "connection around the block stack) or a parameter of another stage"
            )
        return out


def stage_module(
    model: nn.Module,
    plan: StagePlan,
    stage: int,
    *,
    prefix_context: Callable[[], AbstractContextManager[Any]] | None = None,
) -> StageModule:
    """Pipeline stage ``stage`` of ``model`` as ``plan`` splits it (``plan.parent``, the
    block stack, and ``plan.ranges[stage]``, its blocks)."""
    if plan.parent is None:
        raise ValueError("a single-stage plan has no block stack to split")
    blocks = dict(model.named_modules())[plan.parent]
    assert isinstance(blocks, nn.ModuleList)
    return StageModule(
        model,
        blocks,
        plan.ranges[stage],
        last=stage == plan.stages - 1,
        prefix_context=prefix_context,
    )


def build_schedule(
    module: nn.Module,
    *,
    stage: int,
    stages: int,
    device: torch.device,
    group: Any,
    micro_batches: int,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    unwatched: Callable[[], AbstractContextManager[Any]],
) -> Any:
    """GPipe over the pipeline's process ``group``: this rank runs stage ``stage`` of
    ``stages`` (``module``, the ``StageModule``, DDP-wrapped or not), ``micro_batches``
    per step, and the last stage's ``loss_fn(output, target)``. ``unwatched()`` is
    entered around the stage's shape inference (see below)."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    pipeline_stage = PipelineStage(module, stage, stages, device, group=group)
    # The stage infers shapes by running its module on uninitialised tensors: what those
    # produce is not watched for NaN/Inf.
    inference = getattr(pipeline_stage, "_forward_metadata_inference", None)
    if inference is not None:

        def quiet_inference(*args: Any, **kwargs: Any) -> Any:
            with unwatched():
                return inference(*args, **kwargs)

        pipeline_stage._forward_metadata_inference = quiet_inference  # type: ignore[method-assign]
    return ScheduleGPipe(
        pipeline_stage,
        n_microbatches=micro_batches,
        loss_fn=loss_fn,
        scale_grads=True,
    )


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
