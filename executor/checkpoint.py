"""A job's checkpoint is layout-independent: full tensors under the whole model's
parameter names, which any layout restores. Each rank gives its part
(``RankWorker.state``: its stage's weights, buffers and optimizer moments, its
compression state), gathered from tensor-parallel shards with ``full_tensor`` and
``full_from_part``; ``merge_rank_states`` joins the parts into the checkpoint a single
rank would write; a rank restoring it takes its own block with ``local_part``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

__all__ = ["full_from_part", "full_tensor", "local_part", "merge_rank_states"]


def full_tensor(t: Tensor) -> Tensor:
    """The whole of ``t`` (gathered from its tensor-parallel shards where it is a
    ``DTensor``: every peer must call it), detached, on CPU, a copy."""
    gather = getattr(t, "full_tensor", None)
    out = gather() if gather is not None else t
    return out.detach().cpu().clone()


def full_from_part(part: Tensor, like: Tensor) -> Tensor:
    """The full tensor of which ``part`` is this rank's local block, laid out as the
    parameter ``like`` is (every tensor-parallel peer must call it)."""
    from torch.distributed.tensor import DTensor

    if isinstance(like, DTensor):
        part = DTensor.from_local(
            part.reshape(like.to_local().shape), like.device_mesh, like.placements, run_check=False
        ).full_tensor()
    return part.detach().cpu().clone().reshape(like.shape)


def local_part(full: Tensor, like: Tensor) -> Tensor:
    """This rank's block of ``full``, laid out as the parameter ``like`` is."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(like, DTensor):
        local: Tensor = distribute_tensor(
            full, like.device_mesh, like.placements, src_data_rank=None
        ).to_local()
        return local
    return full


def merge_rank_states(parts: list[dict[str, Any] | None]) -> dict[str, Any]:
    """One checkpoint from every rank's ``RankWorker.state()``: the stages' weights,
    buffers and optimizer moments joined under the whole model's names, and the
    compression state of every data-parallel rank (``residuals``: name -> one tensor per
    data-parallel rank, ``None`` where a rank had none; PowerSGD's factors and counters
    from the first rank)."""
    given = [p for p in parts if p]
    main = sorted((p for p in given if "model" in p), key=lambda p: p["stage"])
    if not main:
        raise ValueError("no rank of the first data-parallel replica gave its state")
    merged: dict[str, Any] = {
        "step": main[0]["step"],
        "model": {},
        "buffers": {},
        "optim": {},
        "precision": main[0]["precision"],
        "scaler": main[0]["scaler"],
    }
    for part in main:
        merged["model"].update(part["model"])
        merged["buffers"].update(part.get("buffers", {}))
        merged["optim"].update(part["optim"])
    compressed = [p for p in given if p.get("compression")]
    if compressed:
        first = compressed[0]["compression"]
        dp = int(first["dp"])
        residuals: dict[str, list[Tensor | None]] = {}
        powersgd = None
        for part in compressed:
            state = part["compression"]
            for name, tensor in state["residuals"].items():
                residuals.setdefault(name, [None] * dp)[part["dp_index"]] = tensor
            if part["dp_index"] == 0 and state.get("powersgd") is not None:
                powersgd = state["powersgd"]
        merged["compression"] = {
            "kind": first["kind"],
            "dp": dp,
            "residuals": residuals,
            "powersgd": powersgd,
            "ratio": first.get("ratio"),
        }
    return merged
