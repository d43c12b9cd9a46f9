"""A user's task as a newcomer writes one: a small byte-level language model in a file,
``batches()`` yielding ``(x, y)`` tuples, no ``batch_size`` attribute (the executor counts
samples from the batches), ``seq_len`` for tokens/s. ``DictTask`` and ``TensorTask``
yield the other shapes a task may use; ``Opaque`` yields no tensor at all."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

BATCH = 16  # global samples per step, known to the test only
CONTEXT = 32


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 2 * width)
        self.proj = nn.Linear(2 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = x + self.proj(F.gelu(self.fc(self.norm(x))))
        return out


class TinyNet(nn.Module):
    def __init__(self, width: int = 64, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.head = nn.Linear(width, 256)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        out: Tensor = self.head(x)
        return out


class TinyLM:
    seq_len = CONTEXT

    def build_model(self) -> nn.Module:
        return TinyNet()

    def batches(self, rank: int, world_size: int, seed: int) -> Iterator[tuple[Tensor, Tensor]]:
        step = 0
        while True:
            g = torch.Generator().manual_seed(seed * 7919 + step)
            data = torch.randint(0, 256, (BATCH, CONTEXT + 1), generator=g)
            part = data.tensor_split(world_size)[rank]
            yield part[:, :-1].contiguous(), part[:, 1:].contiguous()
            step += 1

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, targets = batch
        logits = model(inputs)
        return F.cross_entropy(logits.reshape(-1, 256).float(), targets.reshape(-1))


class DictTask(TinyLM):
    def batches(self, rank: int, world_size: int, seed: int) -> Iterator[dict[str, Tensor]]:  # type: ignore[override]
        for x, y in super().batches(rank, world_size, seed):
            yield {"tokens": x, "targets": y}

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> Tensor:  # type: ignore[override]
        return super().loss(model, (batch["tokens"], batch["targets"]))


class Opaque(TinyLM):
    def batches(self, rank: int, world_size: int, seed: int) -> Iterator[list[str]]:  # type: ignore[override]
        while True:
            yield ["no tensor here"]
