"""Training tasks: what a job trains, independent of how it is laid out.

A task is any object with ``build_model() -> nn.Module``, ``batches(rank, world_size,
seed) -> Iterator`` and ``loss(model, batch) -> Tensor``. ``rank``/``world_size`` are the
data-parallel ones: tensor- and pipeline-parallel peers see the same batches. Optional:
``batch_size`` (the global batch, set by the executor from ``--batch-size``),
``seq_len`` (tokens per sample, for tokens/s), ``learning_rate``, ``tp_plan()`` (module
name -> ``"colwise"`` | ``"rowwise"``) and ``split_points()`` (names of the blocks where
pipeline stages begin).

Samples per step, behind every throughput the executor reports: the task's
``batch_size`` when it declares one; otherwise counted from the batches themselves, the
leading dimension of the first tensor in what ``batches()`` yields (a tensor, or the
first tensor found depth-first in a tuple, list or dict, in order), summed over the
data-parallel ranks. A task that declares neither is refused before it starts
(``count_samples``).

For pipeline parallelism a batch is an ``(inputs, targets)`` pair and ``loss`` calls the
model once, on ``inputs``: the last stage replays its output into ``loss``.

Built-in tasks: ``gpt-char`` (a small GPT over the bytes of the running interpreter's
standard-library sources) and ``mlp-synthetic``. User tasks are named
``path/to/file.py:ClassName`` or ``package.module:ClassName``.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
import sysconfig
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, Final, Protocol, cast, runtime_checkable

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from autotune.catalog.tasks import BUILTIN_TASKS, GPTConfig, MLPConfig
from autotune.errors import InputError

__all__ = [
    "GPTChar",
    "MLPSynthetic",
    "TaskError",
    "TrainingTask",
    "count_samples",
    "declared_samples",
    "load_task",
    "stdlib_text",
]


class TaskError(InputError):
    """A task that cannot be loaded or used; the message names it."""


@runtime_checkable
class TrainingTask(Protocol):
    def build_model(self) -> nn.Module: ...

    def batches(self, rank: int, world_size: int, seed: int) -> Iterator[Any]: ...

    def loss(self, model: nn.Module, batch: Any) -> Tensor: ...


def count_samples(batch: Any) -> int | None:
    """Samples in one batch as ``batches()`` yields it: the leading dimension of its first
    tensor (depth-first through tuples, lists and dicts, in order); ``None`` when it holds
    no tensor with a dimension."""
    if isinstance(batch, Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, tuple | list):
        for item in batch:
            found = count_samples(item)
            if found is not None:
                return found
    return None


def declared_samples(task: Any) -> int | None:
    """The global samples per step the task declares (``batch_size``), if any."""
    size = getattr(task, "batch_size", None)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        return None
    return size


def _shard(global_batch: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s part of a global batch: equal parts, the first ``global_batch %
    world_size`` ranks one sample more (``tensor_split``'s rule)."""
    if global_batch < world_size:
        raise TaskError(
            f"batch size {global_batch} is smaller than the data-parallel degree {world_size}"
        )
    base, extra = divmod(global_batch, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


# --------------------------------------------------------------------------------------
# gpt-char
# --------------------------------------------------------------------------------------


@cache
def stdlib_text(max_bytes: int = 4 << 20) -> bytes:
    """Up to ``max_bytes`` of the interpreter's standard-library ``.py`` sources, files in
    sorted order: real text that every Python installation has, offline."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[bytes] = []
    size = 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        size += len(data)
        if size >= max_bytes:
            break
    if size < 1 << 16:
        raise TaskError(f"gpt-char: found only {size} bytes of Python sources under {root}")
    return b"".join(chunks)[:max_bytes]


class CausalSelfAttention(nn.Module):
    """Separate q/k/v/out projections; heads are inferred from the local width, so the
    projections can be sharded column- and row-wise for tensor parallelism."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.head_dim = width // heads
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        q, k, v = (
            proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: Tensor = self.out_proj(y.transpose(1, 2).reshape(b, t, -1))
        return out


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.proj(F.gelu(self.fc(x)))
        return out


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        out: Tensor = x + self.mlp(self.ln_2(x))
        return out


class GPT(nn.Module):
    """nanoGPT's shape without dropout or weight tying (so stages own disjoint weights)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab, config.width)
        self.wpe = nn.Embedding(config.context, config.width)
        self.blocks = nn.ModuleList(Block(config.width, config.heads) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.width)
        self.lm_head = nn.Linear(config.width, config.vocab, bias=False)
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                std = 0.02 / math.sqrt(2 * config.layers) if "proj.weight" in name else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: Tensor) -> Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits: Tensor = self.lm_head(self.ln_f(x))
        return logits


class GPTChar:
    """Next-byte prediction over the standard library's sources with a small GPT.

    Every step draws ``batch_size`` windows of ``context + 1`` bytes from one generator
    seeded by ``(seed, step)``; data-parallel rank ``r`` takes its slice, so any
    data-parallel degree sees the same global batches.
    """

    name = "gpt-char"

    @property
    def seq_len(self) -> int:
        """Tokens (bytes) per sample: the model's context."""
        return self.config.context

    def __init__(self, *, batch_size: int | None = None, config: GPTConfig | None = None) -> None:
        self.config = config or GPTConfig()
        self.batch_size = self.config.batch_size if batch_size is None else batch_size
        self.learning_rate = 3e-3

    def build_model(self) -> nn.Module:
        return GPT(self.config)

    def batches(self, rank: int, world_size: int, seed: int) -> Iterator[tuple[Tensor, Tensor]]:
        data = torch.frombuffer(bytearray(stdlib_text()), dtype=torch.uint8)
        part = _shard(self.batch_size, rank, world_size)
        span = self.config.context + 1
        offsets = torch.arange(span)
        step = 0
        while True:
            generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
            starts = torch.randint(0, len(data) - span, (self.batch_size,), generator=generator)
            windows = data[starts[part, None] + offsets].long()
            yield windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
            step += 1

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, targets = batch
        logits = model(inputs)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


# --------------------------------------------------------------------------------------
# mlp-synthetic
# --------------------------------------------------------------------------------------


class MLPNet(nn.Module):
    def __init__(self, features: int, hidden: int, depth: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Linear(features, hidden)
        self.blocks = nn.ModuleList(MLPBlock(hidden) for _ in range(depth))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        out: Tensor = self.head(self.norm(h))
        return out


class MLPBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = x + self.down(F.gelu(self.up(self.norm(x))))
        return out


_MLP: Final = MLPConfig()  # the shape the catalog's mlp-synthetic profile is counted from


class MLPSynthetic:
    """Classification of Gaussian points by a fixed random teacher network: a task with a
    known-learnable target and no data files."""

    name = "mlp-synthetic"

    def __init__(
        self,
        *,
        batch_size: int = _MLP.batch_size,
        features: int = _MLP.features,
        hidden: int = _MLP.hidden,
        depth: int = _MLP.depth,
        classes: int = _MLP.classes,
        scale: float = 1.0,
    ) -> None:
        self.batch_size = batch_size
        self.features, self.hidden, self.depth, self.classes = features, hidden, depth, classes
        self.scale = scale
        self.learning_rate = 3e-3
        teacher = torch.Generator().manual_seed(12345)
        self._teacher = torch.randn(features, classes, generator=teacher)

    def build_model(self) -> nn.Module:
        return MLPNet(self.features, self.hidden, self.depth, self.classes)

    def batches(self, rank: int, world_size: int, seed: int) -> Iterator[tuple[Tensor, Tensor]]:
        part = _shard(self.batch_size, rank, world_size)
        step = 0
        while True:
            generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
            x = torch.randn(self.batch_size, self.features, generator=generator)
            y = (x @ self._teacher).argmax(dim=1)
            yield (x * self.scale)[part].contiguous(), y[part].contiguous()
            step += 1

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, targets = batch
        return F.cross_entropy(model(inputs).float(), targets)


# --------------------------------------------------------------------------------------
# Loading by name
# --------------------------------------------------------------------------------------


def _trainable() -> list[str]:
    return [name for name, task in BUILTIN_TASKS.items() if task.trainer is not None]


def _import_target(spec: str) -> Any:
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise TaskError(
            f"task {spec!r}: expected a built-in name ({', '.join(_trainable())}), "
            "'path/to/file.py:ClassName' or 'package.module:ClassName'"
        )
    try:
        if where.endswith(".py") or "/" in where:
            path = Path(where).resolve()
            if not path.is_file():
                raise TaskError(f"task {spec!r}: no such file {path}")
            module_name = f"autotune_task_{abs(hash(str(path)))}"
            module_spec = importlib.util.spec_from_file_location(module_name, path)
            if module_spec is None or module_spec.loader is None:
                raise TaskError(f"task {spec!r}: cannot import {path}")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_name] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except TaskError:
        raise
    except Exception as exc:  # the user's module failed while importing
        raise TaskError(f"task {spec!r}: importing {where} failed: {exc!r}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise TaskError(f"task {spec!r}: {where} has no attribute {attr!r}") from None


def load_task(spec: str, *, batch_size: int | None = None) -> TrainingTask:
    """The task named ``spec``, with its global batch set to ``batch_size`` if given."""
    builtin = BUILTIN_TASKS.get(spec)
    if builtin is None:
        target = _import_target(spec)
    elif builtin.trainer is None:
        raise TaskError(
            f"task {spec!r}: a catalog model the simulator runs, with no model the executor "
            f"can build; built-in tasks it trains: {', '.join(_trainable())}"
        )
    else:
        target = _import_target(builtin.trainer)
    try:
        task = target() if isinstance(target, type) or callable(target) else target
    except Exception as exc:
        raise TaskError(f"task {spec!r}: constructing it failed: {exc!r}") from exc
    missing = [
        m for m in ("build_model", "batches", "loss") if not callable(getattr(task, m, None))
    ]
    if missing:
        raise TaskError(
            f"task {spec!r} lacks {', '.join(missing)} (a TrainingTask needs all three)"
        )
    if batch_size is not None:
        if batch_size < 1:
            raise TaskError(f"task {spec!r}: batch size must be >= 1, not {batch_size}")
        task.batch_size = batch_size
    return cast(TrainingTask, task)
