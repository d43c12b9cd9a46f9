"""The parallelize entry point: a rank's model made parallel as its layout says.

As torchtitan's ``parallelize`` (``torchtitan/models/llama3/infra/parallelize.py``) does,
``parallelize`` applies, in this order, each through a small helper:

1. **tensor parallelism** (``tp > 1``): the task's ``tp_plan()`` or the derived one,
   sharding only the modules this rank's pipeline stage holds (``tensor_parallel``);
2. **activation checkpointing** (``Layout.activation_checkpointing``): the blocks this
   rank runs recompute their activations in the backward pass;
3. (torchtitan compiles here: the executor compiles nothing);
4. **data parallelism**: DDP where DDP reduces the gradients (plain all-reduce on a
   data-parallel-only layout, whose bucketed all-reduces overlap the backward pass, and
   PowerSGD, which runs as DDP's communication hook), else a ``GradientReducer`` after
   the backward pass (top-k, int8 and fp8 compression, and every layout with tensor or
   pipeline parallelism). Either way the bytes sent are counted.

A pipeline stage (``pipeline.stage_module``) is made before, and parallelized as the
rank's model; the schedule that runs it (``pipeline.build_schedule``) after, around the
module ``parallelize`` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from torch import nn

from autotune.core import CompressionSpec, JobConfig, Layout
from autotune.executor.compression import (
    ByteCounter,
    CountingAllReduce,
    GradientReducer,
    NamedPowerSGD,
    count_powersgd_traffic,
    counting_allreduce_hook,
    named_powersgd_hook,
    stop_counting_powersgd_traffic,
)
from autotune.executor.errors import ParallelError
from autotune.executor.stage_plan import StagePlan, find_blocks
from autotune.executor.tensor_parallel import apply_tensor_parallel

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

__all__ = [
    "Parallelized",
    "apply_activation_checkpointing",
    "apply_data_parallel",
    "apply_stage_tensor_parallel",
    "parallelize",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Parallelized:
    """What ``parallelize`` made of a rank's model."""

    module: nn.Module
    """What the rank trains: its stage (the model when ``pp == 1``), DDP-wrapped where
    DDP reduces the gradients."""
    tp_plan: dict[str, str]
    """Module name -> tensor-parallel style, as applied (empty when ``tp == 1``)."""
    ddp: DistributedDataParallel | None
    """The ``DistributedDataParallel`` wrapper (``module``) where DDP reduces, else
    ``None``: then ``reducer`` reduces after the backward pass."""
    reducer: GradientReducer
    """The data-parallel reduction of gradients outside DDP (and its error feedback)."""
    powersgd: NamedPowerSGD | None
    """PowerSGD's communication hook with its memories by parameter name, under DDP."""
    counter: ByteCounter
    """Bytes DDP's hooks sent (``reducer`` counts its own)."""


def parallelize(
    model: nn.Module,
    layout: Layout,
    mesh: Any,
    *,
    stage: nn.Module,
    stage_index: int,
    plan: StagePlan,
    blocks: Iterable[nn.Module] | None,
    tp_plan: Mapping[str, Any] | None,
    compression: CompressionSpec,
    seed: int,
) -> Parallelized:
    """Make ``model`` parallel on this rank as ``layout`` says, over ``mesh`` (the
    ``("pp", "dp", "tp")`` device mesh): tensor parallelism, activation checkpointing,
    data parallelism, in that order (see the module docstring).

    ``model`` is the whole module tree (the names plans use); ``stage`` what the rank
    runs of it (a ``StageModule``, or ``model`` itself when ``pp == 1``), holding the
    parameters ``plan`` gives to stage ``stage_index``; ``blocks`` the blocks it runs
    (``None``: the model's whole block stack, found when checkpointing needs it);
    ``tp_plan`` the task's tensor-parallel plan (``None``: derived); ``seed`` seeds
    PowerSGD's random projections."""
    applied: dict[str, str] = {}
    if layout.tp > 1:
        applied = apply_stage_tensor_parallel(model, mesh["tp"], tp_plan, plan, stage_index)
    if layout.activation_checkpointing:
        apply_activation_checkpointing(blocks if blocks is not None else find_blocks(model)[1])
    counter = ByteCounter()
    module, ddp, powersgd = apply_data_parallel(
        stage, model, layout, mesh["dp"], compression=compression, counter=counter, seed=seed
    )
    dp_mesh = mesh["dp"]
    reducer = GradientReducer(
        spec=compression
        if compression.kind != "powersgd"
        else replace(compression, kind="none", rank=None),
        group=dp_mesh.get_group(),
        size=layout.dp,
        rank=dp_mesh.get_local_rank(),
    )
    return Parallelized(
        module=module,
        tp_plan=applied,
        ddp=ddp,
        reducer=reducer,
        powersgd=powersgd,
        counter=counter,
    )


def apply_stage_tensor_parallel(
    model: nn.Module,
    tp_mesh: Any,
    tp_plan: Mapping[str, Any] | None,
    plan: StagePlan,
    stage_index: int,
) -> dict[str, str]:
    """Shard over ``tp_mesh`` the modules of the plan that stage ``stage_index`` holds
    (the others hold no storage); the plan is checked whole. Returns the plan applied."""
    modules = dict(model.named_modules())
    return apply_tensor_parallel(
        model,
        tp_mesh,
        dict(tp_plan) if tp_plan is not None else None,
        keep=lambda name: name in modules and plan.owns_module(modules[name], name, stage_index),
    )


def apply_activation_checkpointing(blocks: Iterable[nn.Module]) -> None:
    """Recompute each block's activations in the backward pass."""
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        inner: Callable[..., Any] = block.forward

        def forward(*args: Any, _inner: Callable[..., Any] = inner, **kwargs: Any) -> Any:
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        block.forward = forward


def apply_data_parallel(
    stage: nn.Module,
    model: nn.Module,
    layout: Layout,
    dp_mesh: Any,
    *,
    compression: CompressionSpec,
    counter: ByteCounter,
    seed: int,
) -> tuple[nn.Module, DistributedDataParallel | None, NamedPowerSGD | None]:
    """Wrap ``stage`` in DDP where DDP reduces its gradients (see the module docstring):
    returns what the rank trains, the DDP wrapper (``None`` without) and PowerSGD's hook
    (``None`` without). DDP's hooks count the bytes they send in ``counter``."""
    dp_group = dp_mesh.get_group()
    stop_counting_powersgd_traffic()
    if compression.kind == "powersgd":
        refusal = JobConfig(layout=layout, compression=compression).executor_refusal()
        if refusal is not None:
            raise ParallelError(refusal)
        if layout.dp > 1:
            return _powersgd_ddp(stage, model, dp_group, compression, counter, seed)
    elif compression.kind == "none" and layout.dp > 1 and layout.tp == 1 and layout.pp == 1:
        # Plain data parallelism is DDP's: its bucketed all-reduces overlap the
        # backward pass. One flat all-reduce after the backward made the dp2 step
        # 1.13-1.15x a plain DDP script's on gpt-char (2-core x86_64, gloo).
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(stage, process_group=dp_group)
        ddp.register_comm_hook(CountingAllReduce(counter, dp_group), counting_allreduce_hook)
        return ddp, ddp, None
    return stage, None, None


def _powersgd_ddp(
    stage: nn.Module,
    model: nn.Module,
    dp_group: Any,
    compression: CompressionSpec,
    counter: ByteCounter,
    seed: int,
) -> tuple[nn.Module, DistributedDataParallel, NamedPowerSGD]:
    """DDP with torch's PowerSGD hook, its memories kept by parameter name (for
    checkpoints)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel

    count_powersgd_traffic(counter)
    # One bucket: PowerSGD chains all-reduces in future callbacks, and with several
    # buckets ranks can issue them in different orders.
    size_mb = sum(p.numel() * 4 for p in model.parameters()) / 2**20 + 1
    ddp = DistributedDataParallel(stage, process_group=dp_group, bucket_cap_mb=size_mb)
    assert compression.rank is not None
    hook_state = powerSGD_hook.PowerSGDState(
        process_group=dp_group,
        matrix_approximation_rank=compression.rank,
        start_powerSGD_iter=2,
        random_seed=seed,
    )
    powersgd = NamedPowerSGD(
        hook_state, {id(p): n for n, p in model.named_parameters()}, counter=counter
    )
    ddp.register_comm_hook(powersgd, named_powersgd_hook)
    return ddp, ddp, powersgd
