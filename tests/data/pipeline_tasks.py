"""Tasks for the pipeline-stage and compression-state tests: a GPT deep enough for four
stages, the same cutting its own stages, the same with its embedding tied to its head,
one whose head reuses the embedding's weight in its forward, and a model with buffers (a
persistent per-block scale, a causal mask computed at construction)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from autotune.catalog.tasks import GPTConfig
from autotune.executor.tasks import GPTChar

SMALL = GPTConfig(layers=8, width=64, heads=4, context=32, batch_size=16)


class GPT8(GPTChar):
    """gpt-char with 8 blocks of width 64."""

    def __init__(self, *, batch_size: int | None = None) -> None:
        super().__init__(batch_size=batch_size, config=SMALL)


class Split(GPT8):
    """GPT8 cutting its own stages: the first two blocks, then the other six."""

    def split_points(self) -> list[str]:
        return ["blocks.2"]


class TiedGPT(GPT8):
    def build_model(self) -> nn.Module:
        model = super().build_model()
        model.lm_head.weight = model.wte.weight
        return model


class _Reusing(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, idx: Tensor) -> Tensor:
        inner = self.inner
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = inner.wte(idx) + inner.wpe(positions)
        for block in inner.blocks:
            x = block(x)
        return F.linear(inner.ln_f(x), inner.wte.weight)


class ReusingGPT(GPT8):
    """The head is the embedding's weight, used in the forward (no tied module)."""

    def build_model(self) -> nn.Module:
        return _Reusing(super().build_model())


class ScaledBlock(nn.Module):
    def __init__(self, width: int, context: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 2 * width)
        self.proj = nn.Linear(2 * width, width)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, width))
        self.register_buffer(
            "mask", torch.tril(torch.ones(context, context)) / context, persistent=False
        )

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[1]
        h = self.proj(F.gelu(self.fc(self.norm(x))))
        mixed = self.mask[:t, :t].to(h.dtype) @ h
        out: Tensor = x + mixed * self.scale
        return out


class BufferNet(nn.Module):
    def __init__(self, width: int = 32, context: int = 16, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.register_buffer("offset", torch.randn(width))  # drawn at construction
        self.blocks = nn.ModuleList(ScaledBlock(width, context) for _ in range(layers))
        self.head = nn.Linear(width, 256)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.embed(idx) + self.offset
        for block in self.blocks:
            x = block(x)
        out: Tensor = self.head(x)
        return out


class BufferTask:
    batch_size = 8
    seq_len = 16
    learning_rate = 3e-3

    def build_model(self) -> nn.Module:
        return BufferNet()

    def batches(self, rank: int, world_size: int, seed: int) -> Iterator[tuple[Tensor, Tensor]]:
        step = 0
        while True:
            g = torch.Generator().manual_seed(seed * 7919 + step)
            data = torch.randint(0, 256, (self.batch_size, self.seq_len + 1), generator=g)
            part = data.tensor_split(world_size)[rank]
            yield part[:, :-1].contiguous(), part[:, 1:].contiguous()
            step += 1

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, targets = batch
        logits = model(inputs)
        return F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1))
