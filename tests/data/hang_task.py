"""A task whose first data-parallel rank hangs once, at step 3, while the marker file
``HANG_MARKER`` exists (it removes the marker first, so the restarted rank goes on)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.executor.tasks import MLPSynthetic

HANG_MARKER = Path(tempfile.gettempdir()) / "autotune-test-hang-once"
HANG_AT = 3


class HangOnce(MLPSynthetic):
    def batches(self, rank: int, world_size: int, seed: int) -> Iterator[Any]:
        for step, batch in enumerate(super().batches(rank, world_size, seed)):
            if step == HANG_AT and rank == 0 and HANG_MARKER.exists():
                HANG_MARKER.unlink()
                time.sleep(3600)
            yield batch
