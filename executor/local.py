"""Runs a job's ranks as local processes, without Ray: one spawned process per rank,
each a ``RankWorker`` driven as the runner drives it (``setup``, ``step``s, ``state``),
over gloo on this machine. For tests and benchmarks of what a rank holds and computes.
``single_rank`` is one rank in this very process (world size 1, on a CPU or a GPU).

    run = run_local(spec, steps=4)
    run.losses()            # per step, as JobRunner reports them
    checkpoint = run.state  # merge_rank_states of every rank's state() after the steps
    run_local(other_spec, steps=2, state=checkpoint)  # restore into any layout
"""

from __future__ import annotations

import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from autotune.executor.checkpoint import merge_rank_states
from autotune.executor.reports import RankStep, distinct_events, job_loss
from autotune.executor.worker import RankWorker, WorkerSpec, _free_port

__all__ = ["LocalRun", "run_local", "single_rank"]


@dataclass
class LocalRun:
    setup: list[dict[str, Any]]
    """Each rank's ``setup`` answer."""
    reports: list[list[RankStep]]
    """Each rank's ``step`` reports, in step order."""
    memory_after_setup: list[dict[str, Any]]
    """Each rank's ``memory()`` once built, before the first step."""
    memory: list[dict[str, Any]]
    """Each rank's ``memory()`` after the last step."""
    state: dict[str, Any] | None
    """The merged checkpoint after the last step (``None`` unless asked for)."""

    def losses(self) -> list[float]:
        """Each step's loss as ``JobRunner`` records it (``job_loss``)."""
        out = []
        for step in zip(*self.reports, strict=True):
            loss = job_loss(step)
            assert loss is not None, "no rank reported the step's loss"
            out.append(loss)
        return out

    def events(self) -> list[dict[str, Any]]:
        """The ranks' events, each once (as ``JobRunner`` records them)."""
        every = distinct_events(report for rank in self.reports for report in rank)
        return sorted(every, key=lambda e: e["step"])


@contextmanager
def single_rank(spec: WorkerSpec, state: dict[str, Any] | None = None) -> Iterator[RankWorker]:
    """A ``RankWorker`` of a one-rank job (``spec``'s layout must have world size 1) set
    up in this process on a free localhost port, from ``state`` if given; its process
    group is closed on the way out."""
    if spec.config.world_size != 1:
        raise ValueError(f"single_rank runs one rank, not {spec.config.world_size}")
    worker = RankWorker(0, spec)
    try:
        worker.setup("127.0.0.1", _free_port(), state)
        yield worker
    finally:
        worker.close()


def _rank_main(rank: int, spec: WorkerSpec, port: int, steps: int, folder: str, save: bool) -> None:
    out = Path(folder) / f"rank-{rank}.pt"
    worker = RankWorker(rank, spec)
    try:
        source = Path(folder) / "state.pt"
        state = torch.load(source, weights_only=False) if source.exists() else None
        answer = worker.setup("127.0.0.1", port, state)
        del state
        after_setup = worker.memory()
        reports = [worker.step() for _ in range(steps)]
        part = worker.state() if save else None
        result: dict[str, Any] = {
            "setup": answer,
            "reports": reports,
            "memory_after_setup": after_setup,
            "memory": worker.memory(),
            "state": part,
        }
    except BaseException:
        result = {"error": traceback.format_exc()}
    finally:
        worker.close()
    torch.save(result, out)


def _failed(folder: str, rank: int, process: Any) -> bool:
    """Whether ``rank``, ended, failed: an exit status, or a result that is an error."""
    path = Path(folder) / f"rank-{rank}.pt"
    if process.exitcode != 0 or not path.exists():
        return True
    return "error" in torch.load(path, weights_only=False)


def _error(folder: str, rank: int) -> str:
    path = Path(folder) / f"rank-{rank}.pt"
    if not path.exists():
        return f"rank {rank} exited without a result"
    return f"rank {rank}:\n{torch.load(path, weights_only=False).get('error')}"


def run_local(
    spec: WorkerSpec,
    steps: int,
    *,
    state: dict[str, Any] | None = None,
    save: bool = True,
    timeout_s: float = 600.0,
) -> LocalRun:
    """Train ``spec``'s job for ``steps`` steps (from the checkpoint ``state`` if given)
    with one local process per rank; ``save``: return the merged checkpoint after."""
    context = torch.multiprocessing.get_context("spawn")
    world = spec.config.world_size
    with tempfile.TemporaryDirectory(prefix="autotune-local-") as folder:
        if state is not None:
            torch.save(state, Path(folder) / "state.pt")
        port = _free_port()
        processes = [
            context.Process(target=_rank_main, args=(rank, spec, port, steps, folder, save))
            for rank in range(world)
        ]
        for process in processes:
            process.start()
        deadline = time.monotonic() + timeout_s
        ended: set[int] = set()
        try:
            while any(p.is_alive() for p in processes):
                for rank, process in enumerate(processes):
                    if rank in ended or process.is_alive():
                        continue
                    ended.add(rank)
                    if _failed(folder, rank, process):
                        # The others may wait for it in a collective: stop them.
                        raise RuntimeError(_error(folder, rank))
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the ranks did not finish within {timeout_s:.0f} s")
                time.sleep(0.1)
        finally:
            for process in processes:
                if process.is_alive():
                    process.kill()
                    process.join()
        results = []
        for rank in range(world):
            path = Path(folder) / f"rank-{rank}.pt"
            if not path.exists():
                raise RuntimeError(f"rank {rank} exited without a result")
            results.append(torch.load(path, weights_only=False))
    errors = [f"rank {i}:\n{r['error']}" for i, r in enumerate(results) if "error" in r]
    if errors:
        raise RuntimeError("\n".join(errors))
    return LocalRun(
        setup=[r["setup"] for r in results],
        reports=[r["reports"] for r in results],
        memory_after_setup=[r["memory_after_setup"] for r in results],
        memory=[r["memory"] for r in results],
        state=merge_rank_states([r["state"] for r in results]) if save else None,
    )
