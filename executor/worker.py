"""One rank of a job: builds the task's model in the job's layout and trains it step by
step. The runner makes one Ray actor of this class per rank; it runs without Ray too.

The rank's coordinates follow ``Layout``: ``rank = (pp_index * dp + dp_index) * tp +
tp_index``, the device mesh ``("pp", "dp", "tp")`` (``mesh``).

``setup`` builds the rank top to bottom: it selects the rank's device, joins the job's
process group and device mesh, builds its pipeline stage's part of the model, applies the
precision map, makes the stage a ``StageModule`` (pp > 1), makes it parallel
(``parallelize``: tensor parallelism, activation checkpointing, data parallelism), then
makes the optimizer, restores the checkpoint and builds the pipeline schedule (pp > 1).
Each step it reports a ``RankStep``.

A rank of pipeline stage ``s`` holds stage ``s``'s parameters only (``build_stage``):
the rest of the model is a skeleton on the ``meta`` device. Its part of a checkpoint
(``state``) is layout-independent: full tensors under the whole model's parameter
names, so ``merge_rank_states`` (``checkpoint``) joins the stages' parts into the
checkpoint a single rank would write, which any other layout restores.

Compression state is part of the checkpoint too: every data-parallel rank's
error-feedback residual (top-k's, PowerSGD's), by parameter name, as a full tensor, and
PowerSGD's warm-start factors, step counter and generator. Restored at the same
data-parallel degree, each rank gets its own residual back (training continues as if
uninterrupted). At another degree each rank gets the mean of the saved residuals: error
feedback owes the optimizer the mean of the ranks' residuals (the average of what each
rank has not sent yet), and ``n`` ranks that each start from that mean owe exactly it
again; the job records a ``compression_state_resharded`` event. Where the state cannot
carry over (the compression changed, or one data-parallel rank reduces nothing) it is
dropped with a ``compression_state_reset`` event.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from autotune.core import CompressionSpec, JobConfig, PrecisionMap
from autotune.executor.checkpoint import full_from_part, full_tensor, local_part
from autotune.executor.compression import (
    ADAPTIVE_REFERENCE_BUDGET,
    EXPLORING_REFERENCE_BUDGET,
    AdaptiveTopk,
    NamedPowerSGD,
    local_grad,
)
from autotune.executor.errors import ParallelError
from autotune.executor.mesh import RankCoordinates, bind_interface, init_mesh
from autotune.executor.parallelize import parallelize
from autotune.executor.pipeline import StageModule, build_schedule, replay, stage_module
from autotune.executor.placement import nvml_index
from autotune.executor.precision import COMPUTE_CLASSES, LossScaler, PrecisionController
from autotune.executor.quality import (
    GUARDED,
    BatchScaling,
    NormGuard,
    Probe,
    Quality,
    ReferenceSchedule,
    agree,
)
from autotune.executor.reports import RankStep
from autotune.executor.stage_build import BuiltStage, build_stage, parameter_bytes
from autotune.executor.stage_plan import derive_split_points
from autotune.executor.tasks import (
    TaskError,
    TrainingTask,
    count_samples,
    declared_samples,
    load_task,
    shares_refusal,
    split_batch,
    splits_unevenly,
)

__all__ = ["RankWorker", "WorkerSpec", "gpu_power_watts"]

_FEEDBACK = ("topk", "powersgd")
"""Compressions with error feedback: their residuals are checkpointed."""
QUALITY_CLASSES = (*COMPUTE_CLASSES, "other")
"""The module classes whose gradient norms a rank measures (``other``: parameters of no
class)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSpec:
    task: str
    config: JobConfig
    seed: int = 0
    batch_size: int | None = None
    device: str = "cpu"
    """``cpu`` (gloo) or ``cuda`` (NCCL)."""
    kernel_backend: str = "reference"
    """Which kernel implementation compression and fp8 use: ``reference`` on CPU (the
    Triton interpreter is for correctness tests), ``auto`` on GPUs."""
    learning_rate: float | None = None
    lr_reference_batch: int | None = None
    """The global batch the learning rate is tuned for (the job's submitted batch).
    Trained at a larger batch, every step's learning rate is the rate times the batch's
    gain from the measured noise scale (``autotune.executor.quality.BatchScaling``, each
    change of more than 10% a ``learning_rate`` event). ``None``, or a batch at or below
    it: the rate as set."""
    noise_prior: float | None = None
    """The noise scale (samples) the gain rests on until the ranks have measured one
    (the job's model's); ``None``: the rate as set until then."""
    threads: int = 1
    step_log: str | None = None
    """A directory each rank appends one JSON line per step to (``RunnerConfig.
    step_log_dir``); ``None``: no log."""
    job: str | None = None
    """The job's id, for the step log."""
    term: int | None = None
    """The leader term that started the ranks (``autotune.executor.fencing``), for the
    step log."""
    measure_quality: bool = True
    """Measure the gradients each step (``autotune.executor.quality``): the noise scale,
    compression fidelity, class norms. Off: no figures and no gradient-norm guard."""
    nonfinite_fallback: bool = True
    """Move a class that produced NaN/Inf one step safer (the step is skipped either way;
    off: as plain dynamic loss scaling, which only skips and backs the scale off)."""
    grad_norm_guard: bool = True
    """Raise a class in fp16 or fp8 one step safer when its gradient norm grows by more
    than 25% three steps in a row (``autotune.executor.quality.NormGuard``)."""
    adaptive_topk: bool = False
    """A top-k job's kept share moves between steps with its measured communication
    share and fidelity (``autotune.executor.compression.AdaptiveTopk``), starting from
    the config's ratio; each move is a ``compression_ratio`` event. Needs
    ``measure_quality``; other compressions ignore it."""

    batch_shares: tuple[float, ...] | None = None
    """The global batch split across the data-parallel ranks in these proportions (one
    weight per rank; ``autotune.executor.tasks.split_batch``) instead of evenly, so that
    a slow device's rank takes fewer samples; gradients are then averaged by samples.
    Needs a data-parallel-only layout and a task whose ``batches`` takes ``shares``.
    ``RankWorker.step(shares=...)`` changes it between steps."""

    stage_weights: tuple[float, ...] | None = None
    """The pipeline stages cut so that each holds blocks in these proportions (one weight
    per stage, e.g. its device's speed: ``stage_plan.derive_split_points``) instead of
    evenly. Needs ``pp`` weights and a task without its own ``split_points()``."""

    def __post_init__(self) -> None:
        layout = self.config.layout
        if self.stage_weights is not None and len(self.stage_weights) != layout.pp:
            raise ParallelError(
                f"{len(self.stage_weights)} stage weights for {layout.pp} pipeline stages"
            )
        if self.batch_shares is not None:
            why = shares_refusal(layout.dp, layout.tp, layout.pp, len(self.batch_shares))
            if why is not None:
                raise ParallelError(why)
        if self.adaptive_topk and not self.measure_quality:
            raise ValueError(
                "adaptive_topk moves the ratio by the measured fidelity: it needs measure_quality"
            )


def _all_finite(grads: list[Tensor]) -> bool:
    """Whether every gradient is finite, in one fused pass: a NaN or Inf anywhere makes
    its tensor's norm non-finite (as would a finite value above ~1e19, which overflows the
    square in float32: no trainable gradient is that large). 2.1 ms per step for
    gpt-char's 69 tensors one by one, 0.2 ms fused (1 thread, 2-core x86_64)."""
    if not grads:
        return True
    return bool(torch.isfinite(torch.stack(torch._foreach_norm(grads))).all())


def gpu_power_watts(index: int) -> float | None:
    """The GPU's power draw through NVML; ``None`` without NVML or GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return float(pynvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0
    except Exception:
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _split(value: Any, parts: int) -> list[Any]:
    if isinstance(value, Tensor):
        return list(value.tensor_split(parts))
    if isinstance(value, tuple | list):
        columns = [_split(v, parts) for v in value]
        return [type(value)(c[i] for c in columns) for i in range(parts)]
    raise ParallelError("micro-batches need batches made of tensors (or tuples of them)")


class RankWorker:
    """Rank ``rank`` of the job ``spec`` describes. ``cuda_index``: the CUDA device it
    computes on where ``spec.device`` is ``cuda``, among those its process sees (the
    Planner's GPU index, or 0 where Ray made one GPU visible; ``placement``)."""

    def __init__(
        self, rank: int, spec: WorkerSpec, *, cuda_index: int = 0, attempt: str = ""
    ) -> None:
        self.rank = rank
        self._log: IO[str] | None = None
        if spec.step_log is not None:
            folder = Path(spec.step_log)
            folder.mkdir(parents=True, exist_ok=True)
            name = f"t{spec.term if spec.term is not None else 0}-r{rank}-{attempt or os.getpid()}"
            self._log = (folder / f"{name}.jsonl").open("a", buffering=1)
        self.spec = spec
        self.cuda_index = cuda_index
        layout = spec.config.layout
        self.pp, self.dp, self.tp = layout.pp, layout.dp, layout.tp
        where = RankCoordinates.of(rank, layout)
        self.pp_index, self.dp_index, self.tp_index = where.pp_index, where.dp_index, where.tp_index
        self.step_count = 0
        self.events: list[dict[str, Any]] = []
        self._restore_events: list[dict[str, Any]] = []
        """Events of restoring a checkpoint, reported with the next step's."""
        self.powersgd: NamedPowerSGD | None = None
        self.shares: tuple[float, ...] | None = spec.batch_shares
        self._weight = 1.0
        """What this rank's loss is multiplied by before backward so that the ranks'
        mean gradient is the mean over samples: dp * its samples / the global batch."""
        torch.set_num_threads(spec.threads)

    # ----------------------------------------------------------------- placement

    def where(self) -> dict[str, Any]:
        try:
            import ray

            node = ray.get_runtime_context().get_node_id()
        except Exception:
            node = socket.gethostname()
        return {"rank": self.rank, "node": node, "pid": os.getpid()}

    @staticmethod
    def _node_address() -> str | None:
        """The address Ray knows this rank's node by, when the rank is a Ray actor."""
        try:
            import ray

            if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
                return None
            return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        except Exception:
            return None

    def rendezvous(self) -> tuple[str, int]:
        return self._node_address() or "127.0.0.1", _free_port()

    # ----------------------------------------------------------------- building

    def setup(self, address: str, port: int, state: dict[str, Any] | None = None) -> dict[str, Any]:
        """Build this rank's part of the job (from the checkpoint ``state`` where given),
        in the order the module docstring gives. Every rank of the job calls it; rank 0
        listens at ``address:port``."""
        spec, layout = self.spec, self.spec.config.layout
        self.device = self._select_device()
        node = self._node_address()
        if node is not None:  # talk to the other ranks on the node's own network
            bind_interface(node)
        self.mesh = init_mesh(
            device=spec.device, layout=layout, rank=self.rank, address=address, port=port
        )
        self.task: TrainingTask = load_task(spec.task, batch_size=spec.batch_size)
        torch.manual_seed(spec.seed)
        self.built = self._build_stage(state)
        self.model, self.plan = self.built.model, self.built.plan
        self.precision = self._precision_controller(state)
        stage = self._stage_module()
        self.stage_blocks = list(stage.span) if stage is not None else None
        parallel = parallelize(
            self.model,
            layout,
            self.mesh,
            stage=stage if stage is not None else self.model,
            stage_index=self.pp_index,
            plan=self.plan,
            blocks=stage.own_blocks if stage is not None else None,
            tp_plan=self._task_tp_plan(),
            compression=spec.config.compression,
            seed=spec.seed,
        )
        self.train_module, self.tp_plan = parallel.module, parallel.tp_plan
        self.ddp, self.reducer = parallel.ddp, parallel.reducer
        self.powersgd, self.counter = parallel.powersgd, parallel.counter
        self.named = self._own_parameters()
        self._classes = self._parameter_classes()
        self.guard = NormGuard()
        compression = spec.config.compression
        self.adaptive = (
            AdaptiveTopk(ratio=compression.ratio)
            if spec.adaptive_topk
            and compression.kind == "topk"
            and compression.ratio is not None
            and self.dp > 1
            and self.ddp is None
            else None
        )
        self.references = (
            ReferenceSchedule(budget=EXPLORING_REFERENCE_BUDGET)
            if self.adaptive is not None
            else ReferenceSchedule()
        )
        self.optimizer = self._optimizer()
        self.base_lr = [float(group["lr"]) for group in self.optimizer.param_groups]
        self.lr_scaling = self._lr_scaling()
        self.lr_gain = 1.0
        """The gain last reported in a ``learning_rate`` event (1 before any)."""
        self.scaler = LossScaler() if self.precision.uses_fp16 else None
        if state is not None:
            self._restore(state)
        self.pipeline = self._schedule() if self.pp > 1 else None
        self.batches = self._open_batches()
        # What setup built lives as long as the rank: keep it out of the collector's full
        # passes, which would walk it every time (planning pipeline stages on the meta
        # device imports torch's Python decompositions, ~130,000 objects: a 160 ms pause
        # in a training step every few steps).
        gc.collect()
        gc.freeze()
        return {
            "rank": self.rank,
            "tp_plan": self.tp_plan,
            "stage_blocks": self.stage_blocks,
            "restore_events": list(self._restore_events),
        }

    def _open_batches(self) -> Iterator[Any]:
        """The task's batches for this rank from the current step, split by
        ``self.shares`` (evenly without them)."""
        spec = self.spec
        if self.shares is None or len(set(self.shares)) == 1:
            self._weight = 1.0
            stream = self.task.batches(self.dp_index, self.dp, spec.seed)
        else:
            total = declared_samples(self.task)
            if total is None or not splits_unevenly(self.task):
                raise TaskError(
                    f"task {spec.task!r} cannot split its batch unevenly: its batches() takes "
                    "no 'shares' keyword or it declares no batch_size (see "
                    "autotune.executor.tasks.split_batch)"
                )
            mine = split_batch(total, self.shares)[self.dp_index]
            self._weight = self.dp * mine / total
            stream = self.task.batches(self.dp_index, self.dp, spec.seed, shares=self.shares)  # type: ignore[call-arg]
        return islice(stream, self.step_count, None)

    def _select_device(self) -> torch.device:
        """The device this rank computes on, made current: on ``cuda``, GPU
        ``cuda_index`` of those the process sees (before the process group starts, so
        that NCCL binds to it)."""
        self._nvml_index: int | None = None
        if self.spec.device != "cuda":
            return torch.device("cpu")
        torch.cuda.set_device(self.cuda_index)
        self._nvml_index = nvml_index(self.cuda_index, os.environ.get("CUDA_VISIBLE_DEVICES"))
        return torch.device("cuda", self.cuda_index)

    def _build_stage(self, state: dict[str, Any] | None) -> BuiltStage:
        """The model with this rank's stage's parameters only (all of them when pp = 1),
        from the checkpoint's tensors where there is one, else initialised as the whole
        model would be (``build_stage``)."""
        spec = self.spec
        values: dict[str, Tensor] | None = None
        if state is not None:
            values = {**state.get("buffers", {}), **state["model"]}
        example: Tensor | None = None
        points_fn = getattr(self.task, "split_points", None)

        def points(skeleton: nn.Module) -> list[str]:
            if callable(points_fn):
                if spec.stage_weights is not None:
                    raise ParallelError(
                        f"task {spec.task!r} gives its own split_points(): stage weights "
                        "apply to stages cut from its block stack only"
                    )
                return list(points_fn())
            return derive_split_points(skeleton, self.pp, spec.stage_weights)

        if self.pp > 1:
            batch = next(iter(self.task.batches(self.dp_index, self.dp, spec.seed)))
            if not (isinstance(batch, tuple | list) and len(batch) == 2):
                raise ParallelError("pipeline parallelism needs batches of (inputs, targets)")
            example = _split(batch[0], spec.config.layout.micro_batches)[0]
        return build_stage(
            self.task.build_model,
            seed=spec.seed,
            stages=self.pp,
            stage=self.pp_index,
            split_points=points,
            example=example,
            device=self.device,
            values=values,
        )

    @contextmanager
    def _prefix_on_meta(self) -> Iterator[None]:
        """Around what a later pipeline stage runs on ``meta`` before its first block: no
        precision casts and no NaN/Inf watching (there are no values to watch)."""
        controller = self.precision
        saved = controller.precision, controller.watching
        controller.precision = PrecisionMap.uniform("fp32")
        controller.watching = False
        try:
            yield
        finally:
            controller.precision, controller.watching = saved

    def _precision_controller(self, state: dict[str, Any] | None) -> PrecisionController:
        """The job's precision map (the checkpoint's, which may have fallen back to a
        safer one) applied to the model."""
        precision = self.spec.config.precision
        if state is not None and "precision" in state:
            precision = PrecisionMap(**state["precision"])
        return PrecisionController(self.model, precision)

    def _stage_module(self) -> StageModule | None:
        """This rank's pipeline stage over the model (``None`` when pp = 1: the rank runs
        the whole model)."""
        if self.pp == 1:
            return None
        return stage_module(
            self.model, self.plan, self.pp_index, prefix_context=self._prefix_on_meta
        )

    def _task_tp_plan(self) -> dict[str, Any] | None:
        """The task's tensor-parallel plan (``None``: derived from the model, or no
        tensor parallelism, where a task that cannot be split need not be asked)."""
        if self.tp == 1:
            return None
        plan_fn = getattr(self.task, "tp_plan", None)
        return dict(plan_fn()) if callable(plan_fn) else None

    def _own_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The parameters this rank's stage holds and trains, by name."""
        owned = self.plan.parameters(self.pp_index)
        return [(n, p) for n, p in self.model.named_parameters() if n in owned]

    def _parameter_classes(self) -> list[int]:
        """Index in ``QUALITY_CLASSES`` of each of ``named``'s parameters' module class."""
        classes = self.precision.classes
        other = len(QUALITY_CLASSES) - 1
        out = []
        for name, _ in self.named:
            module = name.rsplit(".", 1)[0] if "." in name else ""
            cls = classes.get(module)
            out.append(QUALITY_CLASSES.index(cls) if cls in QUALITY_CLASSES else other)
        return out

    def _optimizer(self) -> torch.optim.Optimizer:
        """The task's optimizer over this rank's own parameters where the task makes one
        (``optimizer(model, parameters)``), else AdamW at the task's learning rate. The
        job's learning rate, where it sets one, replaces every parameter group's."""
        make = getattr(self.task, "optimizer", None)
        if callable(make):
            optimizer: torch.optim.Optimizer = make(self.model, list(self.named))
            if self.spec.learning_rate:
                for group in optimizer.param_groups:
                    group["lr"] = self.spec.learning_rate
            return optimizer
        lr = self.spec.learning_rate or float(getattr(self.task, "learning_rate", 1e-3))
        return torch.optim.AdamW([p for _, p in self.named], lr=lr, weight_decay=0.0)

    def _schedule(self) -> Any:
        """The pipeline schedule over this rank's stage (pp > 1)."""
        return build_schedule(
            self.train_module,
            stage=self.pp_index,
            stages=self.pp,
            device=self.device,
            group=self.mesh["pp"].get_group(),
            micro_batches=self.spec.config.layout.micro_batches,
            loss_fn=self._pipeline_loss,
            unwatched=self.precision.paused,
        )

    def _restore(self, state: dict[str, Any]) -> None:
        from torch.distributed.tensor import DTensor, distribute_tensor

        self.step_count = int(state["step"])
        saved = state.get("optim", {})
        for name, p in self.named:
            entry = saved.get(name)
            if entry is None:
                continue
            restored: dict[str, Any] = {}
            for key, value in entry.items():
                value = value.to(self.device)
                if key != "step" and isinstance(p, DTensor):
                    value = distribute_tensor(
                        value, p.device_mesh, p.placements, src_data_rank=None
                    )
                restored[key] = value
            self.optimizer.state[p] = restored
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load(state["scaler"])
        self._restore_compression(state.get("compression"))

    def _note(self, kind: str, detail: str) -> None:
        self._restore_events.append({"step": self.step_count, "kind": kind, "detail": detail})

    def _restore_compression(self, saved: dict[str, Any] | None) -> None:
        """Error feedback and PowerSGD's memories from the checkpoint (see the module
        docstring for what happens when the layout changed)."""
        if not saved or not (saved.get("residuals") or saved.get("powersgd")):
            return
        kind = self.spec.config.compression.kind
        old_kind, old_dp = str(saved["kind"]), int(saved["dp"])
        if kind != old_kind:
            self._note(
                "compression_state_reset",
                f"compression changed from {old_kind} to {kind}: the {old_kind} error-feedback "
                "residuals are dropped",
            )
            return
        if self.dp == 1:
            self._note(
                "compression_state_reset",
                f"data-parallel degree {old_dp} -> 1: a single replica reduces no gradients "
                f"and compresses nothing, so the {kind} residuals are dropped",
            )
            return
        residuals: dict[str, list[Tensor | None]] = saved.get("residuals") or {}
        if old_dp == self.dp:
            mine = {n: ts[self.dp_index] for n, ts in residuals.items()}
        else:
            mine = {
                n: sum((t for t in ts if t is not None), torch.zeros(())) / old_dp
                for n, ts in residuals.items()
                if any(t is not None for t in ts)
            }
            self._note(
                "compression_state_resharded",
                f"data-parallel degree {old_dp} -> {self.dp}: every rank starts from the mean "
                f"of the {old_dp} saved {kind} residuals, which keeps what error feedback "
                "still owes the update (the ranks' mean residual) unchanged",
            )
        own = {n: t for n, t in mine.items() if t is not None}
        ratio = saved.get("ratio")
        if self.adaptive is not None and ratio is not None and ratio != self.adaptive.ratio:
            self._note(
                "compression_ratio",
                f"adaptive top-k resumes at the kept share it had reached, {ratio:g} (the "
                f"config says {self.adaptive.ratio:g})",
            )
            self.adaptive.ratio = float(ratio)
            self.reducer.spec = CompressionSpec(kind="topk", ratio=float(ratio))
        if self.powersgd is not None:
            powersgd = saved.get("powersgd") or {}
            rank = self.powersgd.state.matrix_approximation_rank
            if powersgd.get("p") and powersgd.get("rank") != rank:
                self._note(
                    "compression_state_reset",
                    f"PowerSGD rank {powersgd.get('rank')} -> {rank}: its warm-start factors "
                    "are dropped (the error-feedback residuals are kept)",
                )
            self.powersgd.load(powersgd, {n: t.to(self.device) for n, t in own.items()})
            return
        parts = {
            i: local_part(own[name].to(self.device), p)
            for i, (name, p) in enumerate(self.named)
            if name in own
        }
        self.reducer.load_residual_parts(parts)

    # ----------------------------------------------------------------- training

    def _pipeline_loss(self, output: Tensor, target: Tensor) -> Tensor:
        loss = self.task.loss(replay(output), (None, target))
        return loss * self._loss_scale

    def _forward_backward(self, batch: Any, scale: float) -> float | None:
        m = self.spec.config.layout.micro_batches
        if self.pipeline is not None:
            if not (isinstance(batch, tuple | list) and len(batch) == 2):
                raise ParallelError("pipeline parallelism needs batches of (inputs, targets)")
            inputs, targets = batch
            self._loss_scale = scale
            stage = self.train_module.module if self.ddp is not None else self.train_module
            assert isinstance(stage, StageModule)
            if self.pp_index == 0:
                self.pipeline.step(inputs.to(self.device))
                return None
            stage.template = _split(inputs, m)[0].to("meta")
            if self.pp_index < self.pp - 1:
                self.pipeline.step()
                return None
            losses: list[Tensor] = []
            self.pipeline.step(target=targets.to(self.device), losses=losses)
            return float(torch.stack([x.detach().float() for x in losses]).mean()) / scale
        chunks = _split(batch, m) if m > 1 else [batch]
        total = 0.0
        for i, chunk in enumerate(chunks):
            chunk = _to(chunk, self.device)
            # Under DDP, gradients of all but the last micro-batch accumulate locally and
            # are reduced once, with the last one's.
            last = i == len(chunks) - 1
            with self.ddp.no_sync() if self.ddp is not None and not last else nullcontext():
                loss = self.task.loss(self.train_module, chunk) / len(chunks)
                torch.autograd.backward(loss * (scale * self._weight))
            total += float(loss.detach())
        return total

    def step(self, shares: tuple[float, ...] | None = None) -> RankStep:
        """Train one step. ``shares``: split the global batch in these proportions from
        this step on (``WorkerSpec.batch_shares``); ``None`` keeps the current split."""
        from autotune.kernels import use_backend

        if shares is not None and tuple(shares) != self.shares:
            why = shares_refusal(self.dp, self.tp, self.pp, len(shares))
            if why is not None:
                raise ParallelError(why)
            self.shares = tuple(shares)
            self.batches = self._open_batches()
        began = time.time()
        start = time.perf_counter()
        batch = next(self.batches)
        self.optimizer.zero_grad(set_to_none=True)
        self.precision.nonfinite.clear()
        scale = self.scaler.scale if self.scaler is not None else 1.0
        self.counter.handed_at = None
        compressed = self.spec.config.compression.kind != "none" and self.dp > 1
        measure = self.spec.measure_quality
        probe = Probe(
            reference=compressed and measure and self.references.due(self.step_count),
            seed=self.spec.seed,
            step=self.step_count,
        )
        self.counter.probe = probe if measure and self.dp > 1 else None
        quality: Quality | None = None
        with use_backend(self.spec.kernel_backend):  # type: ignore[arg-type]
            loss = self._forward_backward(batch, scale)
            backward_end = time.perf_counter()
            # Until this rank's gradients were ready: under DDP when backward handed over
            # its last bucket (after that it waits for its peers), else backward's end.
            handed = self.counter.handed_at if self.ddp is not None else None
            compute_s = (handed if handed is not None else backward_end) - start
            sync_s: float | None = None
            params = [p for _, p in self.named]
            flags = torch.zeros(len(COMPUTE_CLASSES) + 1)
            for i, cls in enumerate(COMPUTE_CLASSES):
                flags[i] = float(cls in self.precision.nonfinite)
            grads = [g for g in (local_grad(p) for p in params) if g is not None]
            flags[-1] = float(not _all_finite(grads))
            # The ranks agree on skipping a step. Under DDP with no class in reduced
            # precision they agree already: the gradients were averaged in the backward
            # pass (a NaN anywhere is a NaN everywhere) and no class is watched.
            if self.ddp is None or self.precision.watches_any:
                dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            bad = {cls for i, cls in enumerate(COMPUTE_CLASSES) if flags[i] > 0}
            events: list[dict[str, Any]] = []
            sent = dense = 0
            if bad and self.spec.nonfinite_fallback:
                for change in self.precision.fall_back(bad):
                    events.append({"step": self.step_count, "kind": "nonfinite", **change})
                if self.scaler is not None:
                    self.scaler.update(True)
            elif bad or flags[-1] > 0:  # without the fall-back, a bad class only skips
                events.append(
                    {"step": self.step_count, "kind": "grad_overflow", "loss_scale": scale}
                )
                if self.scaler is not None:
                    self.scaler.update(True)
            else:
                if self.ddp is not None:
                    sent, _ = self.counter.take()
                    dense = sum(g.numel() * 4 for g in grads) if self.dp > 1 else 0
                    # DDP reduces buckets while backward goes on; after it handed over
                    # the last one, backward only waits for the reductions.
                    handed = self.counter.handed_at
                    if self.dp > 1 and handed is not None:
                        sync_s = max(0.0, backward_end - handed)
                else:
                    reduce_start = time.perf_counter()
                    sent, dense = self.reducer.reduce(params, self.step_count, self.counter.probe)
                    if self.dp > 1:
                        sync_s = time.perf_counter() - reduce_start
                if scale != 1.0:
                    for g in grads:
                        g.div_(scale)
                if measure:
                    quality = self._measure(
                        probe, params, grads, scale, compressed, start, sync_s or 0.0
                    )
                    events.extend(self._guard(quality))
                    events.extend(self._adapt(quality))
                events.extend(self._scale_learning_rate(quality))
                self.optimizer.step()
                self.precision.round_optimizer_state(self.optimizer)
                if self.scaler is not None:
                    self.scaler.update(False)
        self.step_count += 1
        if self._log is not None:
            self._log_step(began, time.time())
        events[:0], self._restore_events = self._restore_events, []
        self.events.extend(events)
        elapsed = time.perf_counter() - start
        reports_loss = self.pp_index == self.pp - 1 and self.tp_index == 0
        # One rank per data-parallel replica counts its share of the batch (tensor- and
        # pipeline-parallel peers see the same samples).
        counts = self.pp_index == 0 and self.tp_index == 0
        return RankStep(
            samples=count_samples(batch) if counts else None,
            rank=self.rank,
            step=self.step_count,
            loss=loss if reports_loss else None,
            step_time_s=elapsed,
            compute_time_s=compute_s,
            sync_time_s=sync_s,
            bytes_sent=int(sent),
            bytes_dense=int(dense),
            events=tuple(events),
            peak_memory_bytes=self._peak_memory(),
            power_watts=gpu_power_watts(self._nvml_index) if self._nvml_index is not None else None,
            fp8_mode=self.precision.fp8_mode if self.precision.uses_fp8 else None,
            quality=quality,
            loss_scale=self.scaler.scale if self.scaler is not None else None,
        )

    def _measure(
        self,
        probe: Probe,
        params: list[nn.Parameter],
        grads: list[Tensor],
        scale: float,
        compressed: bool,
        start: float,
        sync_s: float = 0.0,
    ) -> Quality:
        """The step's gradient figures, agreed by all ranks (``quality.agree``); the next
        reference step scheduled after this one."""
        began = time.perf_counter()
        classes = [
            c for p, c in zip(params, self._classes, strict=True) if local_grad(p) is not None
        ]
        class_sq = torch.zeros(len(QUALITY_CLASSES), device=grads[0].device if grads else None)
        if grads:
            norms = torch.stack(torch._foreach_norm(grads)).float()
            index = torch.tensor(classes, device=norms.device)
            class_sq.index_add_(0, index, norms * norms)
        if probe.reference and self.powersgd is not None:
            errors = [e.float() for e in self.powersgd.state.error_dict.values()]
            probe.residual_sq = sum((torch.dot(e, e) for e in errors), torch.zeros(()))
        probe.spent_s += time.perf_counter() - began
        quality = agree(
            probe,
            class_sq,
            QUALITY_CLASSES,
            replicas=self.dp,
            world=self.pp * self.dp * self.tp,
            scale=scale,
            dense_reduction=not compressed,
            step_s=time.perf_counter() - start,
            sync_s=sync_s,
        )
        if probe.reference:
            self.references.done(self.step_count, quality)
        return quality

    def _lr_scaling(self) -> BatchScaling | None:
        """AdaScale's learning rate where the job trains above the batch its rate is
        tuned for (``WorkerSpec.lr_reference_batch``)."""
        reference = self.spec.lr_reference_batch
        batch = declared_samples(self.task)
        if reference is None or batch is None or batch <= reference:
            return None
        return BatchScaling(reference_batch=reference, batch=batch, prior=self.spec.noise_prior)

    def _scale_learning_rate(self, quality: Quality | None) -> list[dict[str, Any]]:
        """Set this step's learning rate from the batch's gain (``BatchScaling``); a
        ``learning_rate`` event where the gain moved by more than 10% (or first left 1)."""
        scaling = self.lr_scaling
        if scaling is None:
            return []
        if quality is not None:
            scaling.record(quality, self.dp, self.step_count)
        gain = scaling.gain
        for group, lr in zip(self.optimizer.param_groups, self.base_lr, strict=True):
            group["lr"] = lr * gain
        if abs(gain - self.lr_gain) <= 0.1 * self.lr_gain:
            return []
        self.lr_gain = gain
        return [
            {
                "step": self.step_count,
                "kind": "learning_rate",
                "gain": round(gain, 4),
                "batch": scaling.batch,
                "reference_batch": scaling.reference_batch,
                "noise_scale": scaling.noise_scale,
                "measured": scaling.noise.reported is not None,
            }
        ]

    def _adapt(self, quality: Quality) -> list[dict[str, Any]]:
        """Adaptive top-k: the next step's kept share (a ``compression_ratio`` event when
        it moves). The error-feedback residual carries over as it is."""
        if self.adaptive is None:
            return []
        before = self.adaptive.ratio
        move = self.adaptive.observe(quality)
        self.references.budget = (
            ADAPTIVE_REFERENCE_BUDGET if self.adaptive.settled else EXPLORING_REFERENCE_BUDGET
        )
        if move is None:
            return []
        self.reducer.spec = CompressionSpec(kind="topk", ratio=move[0])
        self.references.next_step = self.step_count + 1  # the new share's first reference
        return [
            {
                "step": self.step_count,
                "kind": "compression_ratio",
                "from": before,
                "to": move[0],
                "detail": move[1],
            }
        ]

    def _guard(self, quality: Quality) -> list[dict[str, Any]]:
        """The gradient-norm guard: the classes in a narrow-range format (``GUARDED``)
        whose gradients grew too fast move one step safer (events ``grad_norm_growth``)."""
        if not self.spec.grad_norm_guard:
            return []
        present = set(self.precision.classes.values())
        watched = {
            c: n
            for c, n in quality.class_norms.items()
            if c in present and getattr(self.precision.precision, c) in GUARDED
        }
        fired = self.guard.observe(watched)
        if not fired:
            return []
        return [
            {
                "step": self.step_count,
                "kind": "grad_norm_growth",
                "growth": fired[change["module_class"]],
                **change,
            }
            for change in self.precision.fall_back(set(fired))
        ]

    def _log_step(self, began: float, ended: float) -> None:
        assert self._log is not None
        line = {
            "job": self.spec.job,
            "term": self.spec.term,
            "rank": self.rank,
            "node": self._node_address() or socket.gethostname(),
            "pid": os.getpid(),
            "step": self.step_count,
            "start": round(began, 6),
            "end": round(ended, 6),
        }
        self._log.write(json.dumps(line) + "\n")

    def _peak_memory(self) -> int:
        if self.spec.device == "cuda":
            return int(torch.cuda.max_memory_allocated())
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def memory(self) -> dict[str, Any]:
        """What this rank holds: parameter and buffer bytes (local shards), the whole
        model's parameter bytes, the peak memory (GPU: allocated; CPU: resident set), and
        where the stage's tensors came from (``BuiltStage.sources``)."""
        buffers = sum(b.numel() * b.element_size() for b in self.model.buffers() if not b.is_meta)
        return {
            "rank": self.rank,
            "stage": self.pp_index,
            "parameter_bytes": parameter_bytes(self.model),
            "buffer_bytes": buffers,
            "model_parameter_bytes": self.built.model_bytes,
            "peak_memory_bytes": self._peak_memory(),
            "sources": dict(self.built.sources),
        }

    # ----------------------------------------------------------------- checkpoints

    def state(self) -> dict[str, Any] | None:
        """This rank's part of a layout-independent checkpoint (``merge_rank_states``
        joins the parts). Every rank must call it (tensor-parallel shards are gathered).

        The first data-parallel replica's ranks give the full (unsharded) weights, buffers
        and optimizer moments of the parameters their stage holds; every data-parallel
        rank gives its compression state (``compression``: its error-feedback residuals by
        parameter name, full tensors). Tensor-parallel peers other than the first, and
        replicas with nothing to add, return ``None``."""
        compression = self._compression_state()
        part: dict[str, Any] = {
            "stage": self.pp_index,
            "dp_index": self.dp_index,
            "step": self.step_count,
        }
        if compression is not None:
            part["compression"] = compression
        if self.dp_index == 0:
            weights = {name: full_tensor(p) for name, p in self.named}
            optim: dict[str, dict[str, Tensor]] = {}
            for name, p in self.named:
                entry = self.optimizer.state.get(p)
                if entry:
                    optim[name] = {
                        k: full_tensor(v) if isinstance(v, Tensor) else v for k, v in entry.items()
                    }
            held = self.plan.buffers(self.pp_index)
            part.update(
                model=weights,
                buffers={n: full_tensor(b) for n, b in self.model.named_buffers() if n in held},
                optim=optim,
                precision=self.precision.precision.as_dict(),
                scaler=self.scaler.state() if self.scaler is not None else None,
            )
        if self.tp_index or (self.dp_index and compression is None):
            return None
        return part

    def _compression_state(self) -> dict[str, Any] | None:
        """This rank's error feedback (full tensors by parameter name) and PowerSGD's
        memories; ``None`` without error feedback."""
        kind = self.spec.config.compression.kind
        if kind not in _FEEDBACK or self.dp == 1:
            return None
        powersgd: dict[str, Any] | None = None
        if self.powersgd is not None:
            powersgd = self.powersgd.export()
            residuals = {n: t.detach().cpu().clone() for n, t in powersgd.pop("error").items()}
            for key in ("p", "q"):
                powersgd[key] = {n: t.detach().cpu().clone() for n, t in powersgd[key].items()}
        else:
            params = [p for _, p in self.named]
            parts = self.reducer.residual_parts(params)
            residuals = {
                self.named[i][0]: full_from_part(parts[i], params[i]) for i in sorted(parts)
            }
        return {
            "kind": kind,
            "dp": self.dp,
            "residuals": residuals,
            "powersgd": powersgd,
            "ratio": self.reducer.spec.ratio if kind == "topk" else None,
        }

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.unfreeze()  # a process that trains another job next can collect this one


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, Tensor):
        return value.to(device)
    if isinstance(value, tuple | list):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value
