"""Why a job is not placed, in words a user can act on: waiting for more GPUs than are
free for it (step 3), or no set of nodes left that can take its units (steps 5 and
6)."""

from __future__ import annotations

import numpy as np

from autotune.core import MILLI_PER_GPU
from autotune.planner.arrays import BoolArray
from autotune.planner.capacity import FreeCapacity
from autotune.planner.jobs import PreparedJob, spans_nodes


def waiting_reason(job: PreparedJob, have: int, state: FreeCapacity) -> str:
    if spans_nodes(job) and int(job.allowed.sum()) > 1:
        milli = job.spec.gpu_milli
        usable = state.usable_gpus_by_model(milli)
        ok = "free" if milli >= MILLI_PER_GPU else "have it"
        counts = ", ".join(
            f"{m}: {int(usable[i])} {ok}" for i, m in enumerate(state.models) if job.allowed[i]
        )
        asked = f"{job.world} GPU(s)" + (f" with {milli} milli free" if ok == "have it" else "")
        return f"no capacity: waiting for {asked} of one model ({counts})"
    models = ", ".join(m for m, ok in zip(state.models, job.allowed, strict=True) if ok)
    if job.spec.gpu_milli >= MILLI_PER_GPU:
        return f"no capacity: waiting for {job.world} GPU(s) of {models}; {have} free"
    return (
        f"no capacity: waiting for {job.world} GPU(s) with {job.spec.gpu_milli} milli free "
        f"of {models}; {have} have it"
    )


def unplaced_reason(job: PreparedJob, state: FreeCapacity) -> str:
    """Which resource kept the job out, against the state it was given up in."""
    gpus, milli, cpu, mem = job.shape
    eligible = state.gpu_nodes & job.allowed[state.model_safe]
    unit = f"{gpus} GPU(s) at {milli} milli" if milli < MILLI_PER_GPU else f"{gpus} free GPU(s)"
    what = f"{job.units} node(s) with {unit}" if job.units > 1 else f"a node with {unit}"
    gpu_ok = eligible & ((state.free_milli >= milli).sum(axis=1) >= gpus)
    if job.units > 1 and int(job.allowed.sum()) > 1:
        # The units all go to one GPU model: count the nodes of each.
        def by_model(ok: BoolArray) -> tuple[bool, str]:
            counts = np.bincount(state.model_safe[ok], minlength=len(state.models))
            text = ", ".join(
                f"{m}: {int(counts[i])}" for i, m in enumerate(state.models) if job.allowed[i]
            )
            return int(counts.max(initial=0)) < job.units, text

        short, counts = by_model(gpu_ok)
        if short:
            return f"no capacity: needs {what} of one allowed model; {counts} have it"
        cpu_ok = gpu_ok & (state.free_cpu >= cpu)
        short, counts = by_model(cpu_ok)
        if short:
            return (
                f"no capacity: needs {what} of one allowed model and {cpu / 1000:g} free "
                f"cores; {counts} have both"
            )
        short, counts = by_model(cpu_ok & (state.free_mem >= mem))
        if short:
            return (
                f"no capacity: needs {what} of one allowed model, {cpu / 1000:g} cores and "
                f"{mem} MiB; {counts} have all three"
            )
        return "no capacity: competing jobs took the nodes it could use"
    if gpu_ok.sum() < job.units:
        return f"no capacity: needs {what} of an allowed model; {int(gpu_ok.sum())} have it"
    cpu_ok = gpu_ok & (state.free_cpu >= cpu)
    if cpu_ok.sum() < job.units:
        return (
            f"no capacity: needs {what} and {cpu / 1000:g} free cores; "
            f"{int(gpu_ok.sum())} have the GPUs, {int(cpu_ok.sum())} also the cores"
        )
    mem_ok = cpu_ok & (state.free_mem >= mem)
    if mem_ok.sum() < job.units:
        return (
            f"no capacity: needs {what}, {cpu / 1000:g} cores and {mem} MiB; "
            f"{int(mem_ok.sum())} nodes have all three"
        )
    return "no capacity: competing jobs took the nodes it could use"
