"""mlp-synthetic whose second data-parallel rank computes slower: it sleeps
``SLOW_S_PER_SAMPLE`` seconds per sample of its batch in every forward, as a device of
an older generation would take longer for the same samples."""

from __future__ import annotations

import time
from typing import Any

import torch.distributed as dist
from torch import Tensor, nn

from autotune.executor.tasks import MLPSynthetic

SLOW_S_PER_SAMPLE = 0.002


class SlowSecondRank(MLPSynthetic):
    def loss(self, model: nn.Module, batch: Any) -> Tensor:
        if dist.is_initialized() and dist.get_rank() == 1:
            time.sleep(SLOW_S_PER_SAMPLE * int(batch[0].shape[0]))
        return super().loss(model, batch)
