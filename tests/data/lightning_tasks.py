"""LightningModules for the Lightning task tests (``lightning:<this file>:Name``).

``TeacherMLP`` is what the executor trains: a residual MLP (an input projection, a
``ModuleList`` of identical blocks that pipeline parallelism cuts, each a widening and a
narrowing ``Linear`` that tensor parallelism shards, a head) classifying seeded Gaussian
points by a fixed random teacher. Its ``forward`` is the whole model and its
``training_step`` calls it once on the inputs, so pipeline parallelism can run it. The
others each break one rule the task maps, for the refusals.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 16
HIDDEN = 32
CLASSES = 8
DEPTH = 4
SAMPLES = 512
BATCH = 32
LEARNING_RATE = 3e-3
WEIGHT_DECAY = 0.01


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = x + self.down(F.gelu(self.up(self.norm(x))))
        return out


class TeacherMLP(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, HIDDEN)
        self.blocks = nn.ModuleList(Block(HIDDEN) for _ in range(DEPTH))
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        out: Tensor = self.head(h)
        return out

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        loss = F.cross_entropy(self(x).float(), y)
        self.log("train_loss", loss)  # no Trainer: Lightning skips it (the task silences it)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)

    def train_dataloader(self) -> DataLoader[Any]:
        generator = torch.Generator().manual_seed(1234)
        x = torch.randn(SAMPLES, FEATURES, generator=generator)
        teacher = torch.randn(FEATURES, CLASSES, generator=generator)
        y = (x @ teacher).argmax(dim=1)
        return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True, drop_last=True)


class DictLoss(TeacherMLP):
    """``training_step`` returns Lightning's dict; the optimizer is SGD with momentum, in
    a dict."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return {"loss": super().training_step(batch, batch_idx), "batch_idx": batch_idx}

    def configure_optimizers(self) -> Any:
        return {"optimizer": torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)}


class TwoGroups(TeacherMLP):
    """Two parameter groups: the head at a tenth of the learning rate."""

    def configure_optimizers(self) -> Any:
        head = list(self.head.parameters())
        rest = [p for n, p in self.named_parameters() if not n.startswith("head.")]
        return torch.optim.Adam(
            [{"params": rest}, {"params": head, "lr": LEARNING_RATE / 10}], lr=LEARNING_RATE
        )


class Plain(nn.Module):
    """Not a LightningModule."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return torch.zeros(())


class Manual(TeacherMLP):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


class TwoOptimizers(TeacherMLP):
    def configure_optimizers(self) -> Any:
        return [
            torch.optim.Adam(self.embed.parameters()),
            torch.optim.Adam(self.head.parameters()),
        ]


class WithScheduler(TeacherMLP):
    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=LEARNING_RATE)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


class FloatLoss(TeacherMLP):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return float(super().training_step(batch, batch_idx).detach())


class NoLoss(TeacherMLP):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return {"logits": self(batch[0])}


class TwiceForward(TeacherMLP):
    """Calls the model twice: a pipeline runs it once per batch."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return F.cross_entropy(self(x), y) + F.cross_entropy(self(x), y)


class NeedsTrainer(TeacherMLP):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return super().training_step(batch, batch_idx) * self.trainer.world_size


class StepsItself(TeacherMLP):
    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)


class Arguments(TeacherMLP):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width


class NoData(pl.LightningModule):
    """Lightning's defaults for everything but ``training_step``."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        out: Tensor = self.layer(batch).sum()
        return out
