"""A task of a user's own whose numbers outgrow fp16: regression of unnormalised targets
(prices, counts, sensor readings in raw units) of magnitude up to ~2e5 with a plain
ReLU MLP, no normalisation layer. The head must produce values beyond fp16's largest
finite number (65,504): in fp16 its output overflows once the fit gets there, whatever
the loss scale. A task in the form ``autotune job run --task`` takes
(``bench/tasks/large_targets.py:LargeTargets``)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn


class LargeTargets:
    name = "large-targets"

    def __init__(
        self, *, batch_size: int = 64, features: int = 32, hidden: int = 256, magnitude: float = 5e4
    ) -> None:
        self.batch_size = batch_size
        self.features, self.hidden, self.magnitude = features, hidden, magnitude
        self.learning_rate = 3e-2
        teacher = torch.Generator().manual_seed(777)
        self._teacher = torch.randn(features, generator=teacher) / features**0.5

    def build_model(self) -> nn.Module:
        return nn.Sequential(
            nn.Linear(self.features, self.hidden),
            nn.ReLU(),
            nn.Linear(self.hidden, self.hidden),
            nn.ReLU(),
            nn.Linear(self.hidden, 1),
        )

    def batches(self, rank: int, world_size: int, seed: int) -> Iterator[tuple[Tensor, Tensor]]:
        per = self.batch_size // world_size
        step = 0
        while True:
            generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
            x = torch.randn(self.batch_size, self.features, generator=generator)
            y = (x @ self._teacher).abs() * self.magnitude
            yield x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]
            step += 1

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, targets = batch
        prediction = model(inputs).float().squeeze(-1)
        # Relative error, so the loss itself stays small whatever the targets' scale.
        return F.mse_loss(prediction / self.magnitude, targets / self.magnitude)
