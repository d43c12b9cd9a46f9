"""Training tasks: what a job trains, independent of how it is laid out.

A task is any object with ``build_model() -> nn.Module``, ``batches(rank, world_size,
seed) -> Iterator`` and ``loss(model, batch) -> Tensor``. ``rank``/``world_size`` are the
data-parallel ones: tensor- and pipeline-parallel peers see the same batches. Optional:
``batch_size`` (the global batch, set by the executor from ``--batch-size``),
``seq_len`` (tokens per sample, for tokens/s), ``learning_rate``, ``tp_plan()`` (module
name -> ``"colwise"`` | ``"rowwise"``), ``split_points()`` (names of the blocks where
pipeline stages begin) and ``optimizer(model, parameters)`` (the optimizer over
``parameters``, the ``(name, parameter)`` pairs of ``model`` this rank holds and trains:
under tensor or pipeline parallelism a subset of the model's, or shards of them; without
it the rank trains with AdamW at ``learning_rate``). A task whose ``batches`` also takes
a keyword ``shares`` (one weight per data-parallel rank; ``_shard`` and ``split_batch``
implement it, as every built-in task does) can train on uneven per-rank batches: a fast
device's rank takes more of the global batch than a slow one's
(``autotune.executor.balance``).

Samples per step, behind every throughput the executor reports: the task's
``batch_size`` when it declares one; otherwise counted from the batches themselves, the
leading dimension of the first tensor in what ``batches()`` yields (a tensor, or the
first tensor found depth-first in a tuple, list or dict, in order), summed over the
data-parallel ranks. A task that declares neither is refused before it starts
(``count_samples``).

For pipeline parallelism a batch is an ``(inputs, targets)`` pair and ``loss`` calls the
model once, on ``inputs``: the last stage replays its output into ``loss``.

Built-in tasks (``autotune.catalog.tasks.BUILTIN_TASKS`` names the class and the shape
config of each; the catalog's profile is counted from the same config):

- ``gpt-char``, ``gpt-125m``, ``gpt-350m``, ``gpt-1.3b``: GPTs initialised at random,
  predicting the next byte of the running interpreter's standard-library sources
  (``GPTBytes``; ``gpt-char`` is a 0.87 M-parameter one);
- ``bert-large``: an encoder trained as a masked LM on the same bytes (``BERTMasked``);
- ``resnet-50``, ``resnet-152``: bottleneck ResNets classifying seeded synthetic images
  by a fixed random teacher (``ResNetSynthetic``); ``resnet-mini`` is the same at the
  scale of a CIFAR image (0.51 M parameters, 32-pixel images, 10 classes);
- ``ctr-synthetic``: click-through prediction in DLRM's shape, 8 categorical fields of
  4,096 categories drawn by a Zipf law, labelled by a fixed random teacher with
  first-order and pairwise effects (``CTRSynthetic``): 0.53 M parameters, nearly all
  embedding rows, of which a step touches few;
- ``mlp-synthetic``: a residual MLP learning a fixed random teacher.

The catalog's other names (``gpt-7b`` to ``gpt-70b``, the Pollux applications) are
simulated only; ``load_task`` says why. Hugging Face ``transformers`` models are
``hf:<architecture>[-<size>]`` (``autotune.executor.hf``), a ``LightningModule`` is
``lightning:package.module:ClassName`` or ``lightning:path/to/file.py:ClassName``
(``autotune.executor.lightning``). User tasks are named ``path/to/file.py:ClassName`` or
``package.module:ClassName``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import sys
import sysconfig
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Final, Protocol, cast, runtime_checkable

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from autotune.catalog.hf import HF_PREFIX
from autotune.catalog.tasks import (
    BUILTIN_TASKS,
    LIGHTNING_PREFIX,
    BERTConfig,
    CTRConfig,
    GPTConfig,
    MLPConfig,
    ResNetConfig,
    trainable_tasks,
)
from autotune.errors import InputError
from autotune.executor.errors import ParallelError

__all__ = [
    "BERT",
    "GPT",
    "BERTMasked",
    "GPTBytes",
    "GPTChar",
    "MLPSynthetic",
    "ResNet",
    "ResNetSynthetic",
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


def split_batch(global_batch: int, weights: Sequence[float], *, least: int = 1) -> tuple[int, ...]:
    """``global_batch`` samples split in proportion to ``weights`` (one per data-parallel
    rank), each part at least ``least``: the exact proportions rounded down (raised to
    ``least``), the samples left over to the largest remainders (the first rank first on
    ties), or, where raising took more, taken back from the parts most over theirs."""
    parts = len(weights)
    if parts < 1 or any(not math.isfinite(w) or w <= 0 for w in weights):
        raise TaskError(f"batch shares must be positive numbers, one per rank, not {weights}")
    if global_batch < least * parts:
        raise TaskError(
            f"batch size {global_batch} cannot give each of {parts} data-parallel ranks "
            f"{least} sample{'s' if least > 1 else ''} or more"
        )
    total = float(sum(weights))
    exact = [global_batch * w / total for w in weights]
    counts = [max(least, int(x)) for x in exact]
    left = global_batch - sum(counts)
    while left > 0:  # to the largest remainders, the first rank first on ties
        i = max(range(parts), key=lambda i: (exact[i] - counts[i], -i))
        counts[i] += 1
        left -= 1
    while left < 0:  # given to reach ``least``: taken from those most over their part
        i = max(
            (i for i in range(parts) if counts[i] > least),
            key=lambda i: (counts[i] - exact[i], -i),
        )
        counts[i] -= 1
        left += 1
    return tuple(counts)


def _shard(
    global_batch: int, rank: int, world_size: int, shares: Sequence[float] | None = None
) -> slice:
    """Rank ``rank``'s part of a global batch. Without ``shares``, equal parts, the first
    ``global_batch % world_size`` ranks one sample more (``tensor_split``'s rule); with
    them (one weight per rank), parts in their proportions (``split_batch``)."""
    if shares is not None:
        why = shares_refusal(world_size, 1, 1, len(shares))
        if why is not None:
            raise TaskError(why)
        counts = split_batch(global_batch, shares)
        start = sum(counts[:rank])
        return slice(start, start + counts[rank])
    if global_batch < world_size:
        raise TaskError(
            f"batch size {global_batch} is smaller than the data-parallel degree {world_size}"
        )
    base, extra = divmod(global_batch, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def shares_refusal(dp: int, tp: int, pp: int, shares: int | None = None) -> str | None:
    """Why uneven batch shares cannot apply to a layout of ``dp x tp x pp`` (``shares``:
    how many were given), or ``None``: they need data parallelism only, one per rank."""
    if tp > 1 or pp > 1:
        return (
            "uneven batch shares need a data-parallel-only layout (tp = pp = 1), not "
            f"dp={dp} tp={tp} pp={pp}"
        )
    if shares is not None and shares != dp:
        return f"{shares} batch shares for {dp} data-parallel ranks: give one per rank"
    return None


def splits_unevenly(task: Any) -> bool:
    """Whether ``task`` can train on uneven batch shares: its ``batches`` takes
    ``shares`` (``takes_shares``) and it declares its global batch."""
    return takes_shares(task) and declared_samples(task) is not None


def takes_shares(task: Any) -> bool:
    """Whether ``task.batches`` splits a batch unevenly when asked: it takes a ``shares``
    keyword (one weight per data-parallel rank, as ``split_batch`` reads them)."""
    batches = getattr(task, "batches", None)
    if batches is None:
        return False
    try:
        parameters = inspect.signature(batches).parameters
    except (TypeError, ValueError):
        return False
    return "shares" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


# --------------------------------------------------------------------------------------
# Transformers over bytes: gpt-char, gpt-125m, gpt-350m, gpt-1.3b, bert-large
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


def _byte_windows(batch_size: int, span: int, part: slice, seed: int) -> Iterator[Tensor]:
    """Every step, ``batch_size`` windows of ``span`` bytes of ``stdlib_text()`` drawn by
    one generator seeded by ``(seed, step)``; yields the rows in ``part`` (int64)."""
    data = torch.frombuffer(bytearray(stdlib_text()), dtype=torch.uint8)
    if len(data) <= span:
        raise TaskError(f"a context of {span - 1} bytes is longer than the corpus ({len(data)})")
    offsets = torch.arange(span)
    step = 0
    while True:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(0, len(data) - span, (batch_size,), generator=generator)
        yield data[starts[part, None] + offsets].long()
        step += 1


def next_byte_batches(
    batch_size: int, context: int, part: slice, seed: int
) -> Iterator[tuple[Tensor, Tensor]]:
    """Next-byte prediction: every step, ``(inputs, targets)`` of ``batch_size`` windows
    of ``context`` bytes and the same windows one byte on (``_byte_windows``); the rows
    in ``part``."""
    for windows in _byte_windows(batch_size, context + 1, part, seed):
        yield windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def masked_byte_batches(
    batch_size: int, context: int, mask_rate: float, part: slice, seed: int
) -> Iterator[tuple[Tensor, Tensor]]:
    """Masked-LM batches over windows of ``context`` bytes: ``mask_rate`` of the positions
    (at least one per window) are chosen; of those, BERT's rule: 80% become ``MASK_ID``,
    10% a random byte, 10% stay. Targets are the original bytes there and ``IGNORE``
    elsewhere. The rows in ``part``."""
    windows_per_step = _byte_windows(batch_size, context, slice(None), seed)
    for step, windows in enumerate(windows_per_step):
        generator = torch.Generator().manual_seed(seed * 1_000_003 + step + (1 << 40))
        shape = (batch_size, context)
        chosen = torch.rand(shape, generator=generator) < mask_rate
        forced = torch.randint(0, context, (batch_size,), generator=generator)
        chosen[torch.arange(batch_size), forced] = True
        roll = torch.rand(shape, generator=generator)
        noise = torch.randint(0, MASK_ID, shape, generator=generator)
        inputs = torch.where(chosen & (roll < 0.8), MASK_ID, windows)
        inputs = torch.where(chosen & (roll >= 0.8) & (roll < 0.9), noise, inputs)
        targets = torch.where(chosen, windows, IGNORE)
        yield inputs[part].contiguous(), targets[part].contiguous()


class SelfAttention(nn.Module):
    """Separate q/k/v/out projections; heads are inferred from the local width, so the
    projections can be sharded column- and row-wise for tensor parallelism. ``causal``:
    each position attends to itself and earlier ones only (a decoder's)."""

    def __init__(self, width: int, heads: int, *, causal: bool = True) -> None:
        super().__init__()
        if width % heads:
            raise TaskError(f"width {width} is not a multiple of {heads} heads")
        self.head_dim = width // heads
        self.causal = causal
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
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
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
    """A pre-norm transformer block: attention and the feed-forward pair, each on a
    LayerNorm of the residual stream."""

    def __init__(self, width: int, heads: int, *, causal: bool = True) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads, causal=causal)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        out: Tensor = x + self.mlp(self.ln_2(x))
        return out


def _init_transformer(model: nn.Module, layers: int) -> None:
    """GPT-2's initialisation: weights N(0, 0.02), the residual projections' scaled by
    1/sqrt(2 x layers), biases zero, LayerNorms at identity."""
    for name, p in model.named_parameters():
        if name.endswith("weight") and p.dim() == 2:
            std = 0.02 / math.sqrt(2 * layers) if "proj.weight" in name else 0.02
            nn.init.normal_(p, 0.0, std)
        elif name.endswith("bias"):
            nn.init.zeros_(p)


class GPT(nn.Module):
    """nanoGPT's shape without dropout or weight tying (so stages own disjoint weights);
    ``autotune.catalog.profiles.gpt_parameters`` counts its parameters."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab, config.width)
        self.wpe = nn.Embedding(config.context, config.width)
        self.blocks = nn.ModuleList(Block(config.width, config.heads) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.width)
        self.lm_head = nn.Linear(config.width, config.vocab, bias=False)
        _init_transformer(self, config.layers)

    def forward(self, idx: Tensor) -> Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits: Tensor = self.lm_head(self.ln_f(x))
        return logits


class GPTBytes:
    """Next-byte prediction over the standard library's sources with a GPT of shape
    ``config``, initialised at random. A vocabulary above 256 (the catalog's GPTs keep
    GPT-2's 50,257) costs what it costs the published model; only ids 0-255 occur.

    Every step draws ``batch_size`` windows of ``context + 1`` bytes from one generator
    seeded by ``(seed, step)``; data-parallel rank ``r`` takes its slice, so any
    data-parallel degree sees the same global batches.
    """

    def __init__(self, *, config: GPTConfig | None = None, batch_size: int | None = None) -> None:
        self.config = config or GPTConfig()
        self.batch_size = self.config.batch_size if batch_size is None else batch_size
        self.learning_rate = self.config.learning_rate

    @property
    def seq_len(self) -> int:
        """Tokens (bytes) per sample: the model's context."""
        return self.config.context

    def build_model(self) -> nn.Module:
        return GPT(self.config)

    def batches(
        self, rank: int, world_size: int, seed: int, *, shares: Sequence[float] | None = None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        part = _shard(self.batch_size, rank, world_size, shares)
        return next_byte_batches(self.batch_size, self.config.context, part, seed)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, targets = batch
        logits = model(inputs)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


class GPTChar(GPTBytes):
    """``gpt-char``: a 0.87 M-parameter GPT (``GPTConfig()``) over 64 bytes of context."""

    name = "gpt-char"


class BERT(nn.Module):
    """BERT's encoder with the GPT's blocks, bidirectional: token and position embeddings,
    pre-norm blocks (BERT's own are post-norm; pre-norm trains from scratch without
    warm-up and has the same parameters), a final LayerNorm, BERT's masked-LM head (h x h
    transform, GELU, LayerNorm) and an untied vocabulary projection with a bias.
    ``autotune.catalog.profiles.bert_parameters`` counts its parameters."""

    def __init__(self, config: BERTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab, config.width)
        self.wpe = nn.Embedding(config.context, config.width)
        self.blocks = nn.ModuleList(
            Block(config.width, config.heads, causal=False) for _ in range(config.layers)
        )
        self.ln_f = nn.LayerNorm(config.width)
        self.head_transform = nn.Linear(config.width, config.width)
        self.head_norm = nn.LayerNorm(config.width)
        self.lm_head = nn.Linear(config.width, config.vocab)
        _init_transformer(self, config.layers)

    def forward(self, idx: Tensor) -> Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        x = self.head_norm(F.gelu(self.head_transform(self.ln_f(x))))
        logits: Tensor = self.lm_head(x)
        return logits


MASK_ID: Final = 256
"""The id of BERT's [MASK] on byte inputs: the first id after the bytes."""
IGNORE: Final = -100
"""The target of positions the masked-LM loss skips (``cross_entropy``'s default)."""


class BERTMasked:
    """Masked-LM over the standard library's sources with a BERT of shape ``config``,
    initialised at random: every step draws ``batch_size`` windows of ``context`` bytes
    (as ``GPTBytes`` does) and picks ``mask_rate`` of the positions (at least one per
    window) to predict; of those, BERT's rule: 80% become ``MASK_ID``, 10% a random byte,
    10% stay. Targets are the original bytes there and ``IGNORE`` elsewhere."""

    def __init__(self, *, config: BERTConfig | None = None, batch_size: int | None = None) -> None:
        self.config = config or BERTConfig()
        if self.config.vocab <= MASK_ID:
            raise TaskError(
                f"a masked LM over bytes needs a vocabulary above {MASK_ID} (the mask's id), "
                f"not {self.config.vocab}"
            )
        self.batch_size = self.config.batch_size if batch_size is None else batch_size
        self.learning_rate = self.config.learning_rate

    @property
    def seq_len(self) -> int:
        return self.config.context

    def build_model(self) -> nn.Module:
        return BERT(self.config)

    def batches(
        self, rank: int, world_size: int, seed: int, *, shares: Sequence[float] | None = None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        part = _shard(self.batch_size, rank, world_size, shares)
        c = self.config
        return masked_byte_batches(self.batch_size, c.context, c.mask_rate, part, seed)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, targets = batch
        logits = model(inputs)
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE
        )


# --------------------------------------------------------------------------------------
# resnet-50, resnet-152
# --------------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    """1x1 narrow, 3x3 (carrying the stride, torchvision's v1.5), 1x1 widen to 4x, each
    followed by a batch norm; the shortcut is a 1x1 projection where the shape changes.
    The last batch norm starts at zero, so each block starts as the identity (Goyal et
    al. 2017)."""

    def __init__(self, channels: int, inner: int, stride: int) -> None:
        super().__init__()
        out = 4 * inner
        self.conv1 = nn.Conv2d(channels, inner, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(inner)
        self.conv2 = nn.Conv2d(inner, inner, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(inner)
        self.conv3 = nn.Conv2d(inner, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        nn.init.zeros_(self.bn3.weight)
        self.shortcut: nn.Module | None = None
        if stride != 1 or channels != out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: Tensor) -> Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        identity = x if self.shortcut is None else self.shortcut(x)
        out: Tensor = F.relu(y + identity)
        return out


class ResNet(nn.Module):
    """A bottleneck ResNet (He et al. 2016) of shape ``config``: the stem, then every
    stage's bottlenecks in one ``nn.ModuleList`` (``blocks``: the pipeline's grain, cut
    evenly by block count), global average pooling and the classifier (``fc``).
    ``autotune.catalog.profiles.resnet_parameters`` counts its parameters: 25,557,032 for
    ResNet-50, 60,192,808 for ResNet-152, as torchvision's."""

    def __init__(self, config: ResNetConfig) -> None:
        super().__init__()
        self.config = config
        self.conv1 = nn.Conv2d(3, config.width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(config.width)
        blocks: list[nn.Module] = []
        channels = config.width
        for stage, count in enumerate(config.blocks):
            inner = config.width << stage
            for index in range(count):
                stride = 2 if stage > 0 and index == 0 else 1
                blocks.append(Bottleneck(channels, inner, stride))
                channels = 4 * inner
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(channels, config.classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, stride=2, padding=1)
        for block in self.blocks:
            x = block(x)
        out: Tensor = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return out


class ResNetSynthetic:
    """Classification of seeded synthetic images by a fixed random teacher with a ResNet
    of shape ``config``: each image is ``latent`` smooth random patterns (4x4 colour
    grids upsampled to the image) weighted by a Gaussian latent vector, plus pixel noise;
    its label is the argmax of a fixed random map of the latent vector over the classes.
    The label is a function of the image, so the loss goes down; no data files.

    Tensor parallelism is refused: a ResNet has no attention projections or feed-forward
    pair of ``nn.Linear`` layers to shard. Pipeline stages cut ``blocks`` evenly."""

    latent = 16
    noise = 0.5

    def __init__(
        self, *, config: ResNetConfig | None = None, batch_size: int | None = None
    ) -> None:
        self.config = config or ResNetConfig()
        self.batch_size = self.config.batch_size if batch_size is None else batch_size
        self.learning_rate = self.config.learning_rate
        teacher = torch.Generator().manual_seed(12345)
        grids = torch.randn(self.latent, 3, 4, 4, generator=teacher)
        side = self.config.image
        self._patterns = F.interpolate(grids, size=(side, side), mode="bilinear")
        self._teacher = torch.randn(self.latent, self.config.classes, generator=teacher)

    def build_model(self) -> nn.Module:
        return ResNet(self.config)

    def tp_plan(self) -> dict[str, str]:
        raise ParallelError(
            f"a ResNet ({sum(self.config.blocks)} bottleneck blocks) cannot be split for "
            "tensor parallelism: its layers are convolutions, with no attention projections "
            "or nn.Linear feed-forward pairs to shard; use data or pipeline parallelism"
        )

    def batches(
        self, rank: int, world_size: int, seed: int, *, shares: Sequence[float] | None = None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        part = _shard(self.batch_size, rank, world_size, shares)
        side = self.config.image
        step = 0
        while True:
            base = seed * 1_000_003 + step
            generator = torch.Generator().manual_seed(base)
            z = torch.randn(self.batch_size, self.latent, generator=generator)
            # Image by image, each with its own noise generator: a rank makes only its
            # slice, and the same pixels whatever the data-parallel degree.
            images = torch.stack(
                [
                    torch.einsum("k,kchw->chw", z[i], self._patterns)
                    + self.noise
                    * torch.randn(
                        3,
                        side,
                        side,
                        generator=torch.Generator().manual_seed(base + ((i + 1) << 32)),
                    )
                    for i in range(self.batch_size)[part]
                ]
            )
            labels = (z @ self._teacher).argmax(dim=1)[part]
            yield images.contiguous(), labels
            step += 1

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, targets = batch
        return F.cross_entropy(model(inputs).float(), targets)


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
        config: MLPConfig | None = None,
    ) -> None:
        """``config``, where given, sets the shape and the batch in place of the others."""
        if config is not None:
            batch_size, features, hidden = config.batch_size, config.features, config.hidden
            depth, classes = config.depth, config.classes
        self.batch_size = batch_size
        self.features, self.hidden, self.depth, self.classes = features, hidden, depth, classes
        self.scale = scale
        self.learning_rate = 3e-3
        teacher = torch.Generator().manual_seed(12345)
        self._teacher = torch.randn(features, classes, generator=teacher)

    def build_model(self) -> nn.Module:
        return MLPNet(self.features, self.hidden, self.depth, self.classes)

    def batches(
        self, rank: int, world_size: int, seed: int, *, shares: Sequence[float] | None = None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        part = _shard(self.batch_size, rank, world_size, shares)
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
# ctr-synthetic
# --------------------------------------------------------------------------------------


class CTRNet(nn.Module):
    """DLRM's shape, small: one embedding table for every field (a field's rows at its
    offset), the rows of a sample concatenated into a ReLU layer (``up``) and a logit
    (``head``). No block stack: neither pipelined nor tensor parallel."""

    offsets: Tensor

    def __init__(self, c: CTRConfig) -> None:
        super().__init__()
        self.fields, self.categories = c.fields, c.categories
        self.embed = nn.Embedding(c.fields * c.categories, c.dim)
        nn.init.normal_(self.embed.weight, std=0.05)
        self.up = nn.Linear(c.fields * c.dim, c.hidden)
        self.head = nn.Linear(c.hidden, 1)
        offsets = torch.arange(c.fields) * c.categories
        self.register_buffer("offsets", offsets, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        rows = self.embed(x + self.offsets).flatten(1)
        out: Tensor = self.head(F.relu(self.up(rows))).squeeze(1)
        return out


class CTRSynthetic:
    """Click-through prediction on seeded synthetic impressions: each of ``fields``
    categorical features draws one of ``categories`` values by a Zipf law (exponent
    1.05: a few popular values, a long tail), and a fixed random teacher labels it from
    each value's own effect and the fields' pairwise interactions (factorisation
    machine, rank 4) plus noise. The popular rows learn first, the tail slowly, so the
    loss falls over hundreds of steps. No data files."""

    zipf = 1.05
    factors = 4
    noise = 0.5

    def __init__(self, *, config: CTRConfig | None = None, batch_size: int | None = None):
        self.config = config or CTRConfig()
        self.batch_size = self.config.batch_size if batch_size is None else batch_size
        self.learning_rate = self.config.learning_rate
        c = self.config
        teacher = torch.Generator().manual_seed(12345)
        self._bias = torch.randn(c.fields, c.categories, generator=teacher)
        self._factors = 0.5 * torch.randn(c.fields, c.categories, self.factors, generator=teacher)
        ranks = torch.arange(1, c.categories + 1, dtype=torch.float64)
        popularity = ranks**-self.zipf
        self._popularity = (popularity / popularity.sum()).float()

    def build_model(self) -> nn.Module:
        return CTRNet(self.config)

    def tp_plan(self) -> dict[str, str]:
        raise ParallelError(
            "ctr-synthetic cannot be split for tensor parallelism: its parameters are one "
            "embedding table and two small layers; use data parallelism"
        )

    def batches(
        self, rank: int, world_size: int, seed: int, *, shares: Sequence[float] | None = None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        part = _shard(self.batch_size, rank, world_size, shares)
        fields = self.config.fields
        index = torch.arange(fields)
        step = 0
        while True:
            generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
            x = torch.multinomial(
                self._popularity, self.batch_size * fields, replacement=True, generator=generator
            ).view(self.batch_size, fields)
            first = self._bias[index, x].sum(1) / math.sqrt(fields)
            v = self._factors[index, x]  # (batch, fields, factors)
            pairs = (v.sum(1).square().sum(1) - v.square().sum((1, 2))) / fields
            noise = self.noise * torch.randn(self.batch_size, generator=generator)
            y = (first + pairs + noise > 0).float()
            yield x[part].contiguous(), y[part].contiguous()
            step += 1

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, targets = batch
        return F.binary_cross_entropy_with_logits(model(inputs).float(), targets)


# --------------------------------------------------------------------------------------
# Loading by name
# --------------------------------------------------------------------------------------


def _import_target(spec: str) -> Any:
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise TaskError(
            f"task {spec!r}: expected a built-in name ({', '.join(trainable_tasks())}), "
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
    if spec.startswith(HF_PREFIX):
        from autotune.executor.hf import HFTask

        return cast(TrainingTask, HFTask(spec, batch_size=batch_size))
    if spec.startswith(LIGHTNING_PREFIX):
        from autotune.executor.lightning import LightningTask

        return cast(TrainingTask, LightningTask(spec, batch_size=batch_size))
    builtin = BUILTIN_TASKS.get(spec)
    kwargs: dict[str, Any] = {}
    if builtin is None:
        target = _import_target(spec)
    elif builtin.trainer is None:
        raise TaskError(
            f"task {spec!r} is simulated only: {builtin.simulated_only}. Built-in tasks the "
            f"executor trains: {', '.join(trainable_tasks())}"
        )
    else:
        target = _import_target(builtin.trainer)
        if builtin.shape is not None:
            kwargs["config"] = builtin.shape
    try:
        task = target(**kwargs) if isinstance(target, type) or callable(target) else target
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
