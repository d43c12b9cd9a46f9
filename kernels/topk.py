"""Top-k gradient compression with error feedback.

``topk_compress(grad, residual, ratio)`` adds the residual to the gradient
(``acc = grad + residual``, in the gradient's dtype), selects the k = ceil(ratio * n)
entries of largest magnitude, returns their values and flat indices, and leaves in
``residual`` the accumulator with the selected entries zeroed. Nothing is lost: scattering
``values`` at ``indices`` onto the new residual gives ``grad + old residual`` bit for bit.

Selection:

- exact (the default): exactly k entries; every selected magnitude is at least every
  unselected one; among entries tied at the k-th magnitude the lowest indices win, so the
  result is deterministic and the same on every backend. NaN counts as the largest
  magnitude (it is sent, not kept in the residual).
- sampled (``exact=False``, as in Deep Gradient Compression): the threshold is the k-th
  magnitude scaled down to a random sample of about ``SAMPLE_TOP / ratio`` entries, and
  every entry at or above it is selected. The count is then within ±10 % of k; a sample
  that misses that band falls back to exact selection, as does a tensor smaller than four
  samples. ``seed`` fixes the sample.

Indices are int64 positions in the flattened tensor, in ascending order.

The Triton path is a radix select on the bit patterns of |acc| (which order like the
magnitudes): histogram passes over 11/10/10 bits (fp32) or 7/8 bits (16-bit) narrow the
threshold to one bit pattern, then a counting pass and a compaction pass write values and
indices at offsets from an exclusive scan of per-block counts. The first pass also writes
``acc`` into ``residual``. Nothing waits for the GPU except the count check of sampled
selection.
"""

from __future__ import annotations

import math
from typing import Final

import torch

from autotune.kernels import _launch
from autotune.kernels._launch import cast_rne, tl

__all__ = [
    "COUNT_TOLERANCE",
    "SAMPLE_TOP",
    "topk_compress",
    "topk_compress_reference",
    "topk_count",
]

SAMPLE_TOP: Final = 1024
COUNT_TOLERANCE: Final = 0.1

# Bits of |x| as an integer: the sign cleared, the rest orders like the magnitude.
_KEY_MASK: Final[dict[torch.dtype, int]] = {
    torch.float32: 0x7FFFFFFF,
    torch.bfloat16: 0x7FFF,
    torch.float16: 0x7FFF,
}
# (shift, width) of each radix-select pass, most significant digit first.
_DIGITS: Final[dict[int, tuple[tuple[int, int], ...]]] = {
    0x7FFFFFFF: ((20, 11), (10, 10), (0, 10)),
    0x7FFF: ((8, 7), (0, 8)),
}
_BLOCK: Final = 4096  # compiled; see _launch.block
_NUM_WARPS: Final = 8  # every top-k launch (not _launch.num_warps's 4 for a 4096 block)


def topk_count(numel: int, ratio: float) -> int:
    """k = ceil(ratio * numel), where a product within 1e-9 (relative) of an integer counts
    as that integer (so a ratio of 0.01 of 300 entries is 3, not 4); at least 1 entry of
    a non-empty tensor, at most all of them."""
    if numel <= 0:
        return 0
    product = ratio * numel
    nearest = round(product)
    k = nearest if abs(product - nearest) <= 1e-9 * max(1.0, product) else math.ceil(product)
    return min(numel, max(1, k))


def _check(grad: torch.Tensor, residual: torch.Tensor, ratio: float) -> int:
    if not isinstance(grad, torch.Tensor) or not isinstance(residual, torch.Tensor):
        raise TypeError("topk_compress: grad and residual must be tensors")
    if grad.dtype not in _KEY_MASK:
        raise ValueError(f"topk_compress: grad dtype {grad.dtype} is not float32/bfloat16/float16")
    if residual.dtype != grad.dtype:
        raise ValueError(f"topk_compress: residual is {residual.dtype}, grad is {grad.dtype}")
    if residual.shape != grad.shape:
        raise ValueError(
            f"topk_compress: residual shape {tuple(residual.shape)} != grad shape "
            f"{tuple(grad.shape)}"
        )
    if residual.device != grad.device:
        raise ValueError(f"topk_compress: residual on {residual.device}, grad on {grad.device}")
    if not residual.is_contiguous():
        raise ValueError("topk_compress: residual must be contiguous (it is updated in place)")
    if residual.numel() and residual.data_ptr() == grad.data_ptr():
        raise ValueError("topk_compress: residual and grad must not share memory")
    if isinstance(ratio, bool) or not isinstance(ratio, int | float):
        raise TypeError(f"topk_compress: ratio must be a number, not {type(ratio).__name__}")
    if not 0 < ratio <= 1:
        raise ValueError(f"topk_compress: ratio must be in (0, 1], not {ratio}")
    return topk_count(grad.numel(), float(ratio))


def _keys(acc: torch.Tensor) -> torch.Tensor:
    """|acc| as int32 bit patterns (NaN above infinity)."""
    if acc.dtype == torch.float32:
        return acc.view(torch.int32) & 0x7FFFFFFF
    return acc.view(torch.int16).to(torch.int32) & 0x7FFF


def _sample_size(numel: int, ratio: float) -> int | None:
    """Entries in the sample of sampled selection; None where a sample saves nothing."""
    size = math.ceil(SAMPLE_TOP / ratio)
    return size if 4 * size <= numel else None


def _sample_threshold(
    grad: torch.Tensor, residual: torch.Tensor, size: int, ratio: float, seed: int
) -> torch.Tensor:
    """The k-th largest key of a random sample of ``grad + residual``, k scaled to the
    sample (a 0-d int32 tensor on the tensors' device)."""
    generator = torch.Generator(device=grad.device)
    generator.manual_seed(seed)
    positions = torch.randint(0, grad.numel(), (size,), generator=generator, device=grad.device)
    keys = _keys(grad[positions] + residual[positions])
    return torch.topk(keys, topk_count(size, ratio), sorted=False).values.min()


def _within_tolerance(count: int, k: int) -> bool:
    return abs(count - k) <= COUNT_TOLERANCE * k


def topk_compress_reference(
    grad: torch.Tensor,
    residual: torch.Tensor,
    ratio: float,
    *,
    exact: bool = True,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch ``topk_compress`` (``torch.topk`` finds the k-th magnitude)."""
    k = _check(grad, residual, ratio)
    acc = residual.view(-1)
    flat_grad = grad.reshape(-1)
    if k == 0:
        return acc.new_empty(0), torch.empty(0, dtype=torch.int64, device=acc.device)
    size = None if exact else _sample_size(acc.numel(), ratio)
    threshold = None if size is None else _sample_threshold(flat_grad, acc, size, ratio, seed)
    acc.add_(flat_grad)  # IEEE addition commutes: bit for bit grad + residual
    keys = _keys(acc)
    selected = None
    if threshold is not None:
        selected = keys >= threshold
        if not _within_tolerance(int(selected.sum()), k):
            selected = None
    if selected is None:
        kth = torch.topk(keys, k, sorted=False).values.min()
        above = keys > kth
        tied = keys == kth
        wanted = k - above.sum()
        selected = above | (tied & (torch.cumsum(tied, 0) <= wanted))
    indices = torch.nonzero(selected).squeeze(1)
    values = acc[indices]
    acc[indices] = 0
    return values, indices


@_launch.jit
def _magnitude_key(a: tl.tensor, KEY_MASK: tl.constexpr) -> tl.tensor:
    if KEY_MASK == 0x7FFFFFFF:
        key = a.to(tl.int32, bitcast=True) & KEY_MASK
    else:
        key = a.to(tl.int16, bitcast=True).to(tl.int32) & KEY_MASK
    return key


@_launch.jit
def _accumulate_or_load(
    grad_ptr: tl.tensor,
    acc_ptr: tl.tensor,
    offs: tl.tensor,
    mask: tl.tensor,
    ACCUMULATE: tl.constexpr,
) -> tl.tensor:
    if ACCUMULATE:
        g = tl.load(grad_ptr + offs, mask=mask, other=0.0)
        r = tl.load(acc_ptr + offs, mask=mask, other=0.0)
        # Exact sum in fp32, one rounding to the dtype: what torch computes.
        a = cast_rne(g.to(tl.float32) + r.to(tl.float32), acc_ptr.dtype.element_ty)
        tl.store(acc_ptr + offs, a, mask=mask)
    else:
        a = tl.load(acc_ptr + offs, mask=mask, other=0.0)
    return a


@_launch.jit
def _topk_hist_kernel(
    grad_ptr: tl.tensor,
    acc_ptr: tl.tensor,
    state_ptr: tl.tensor,
    hist_ptr: tl.tensor,
    n: tl.tensor,
    ACCUMULATE: tl.constexpr,
    KEY_MASK: tl.constexpr,
    SHIFT: tl.constexpr,
    WIDTH: tl.constexpr,
    NBINS: tl.constexpr,
    BLOCK: tl.constexpr,
) -> None:
    """Histogram of the digit at SHIFT of the keys whose higher bits equal the prefix so
    far (state[0]); a persistent loop keeps one histogram per program."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    prefix = tl.load(state_ptr).to(tl.int32)
    hist = tl.zeros((NBINS,), dtype=tl.int32)
    for start in range(pid.to(tl.int64) * BLOCK, n, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        a = _accumulate_or_load(grad_ptr, acc_ptr, offs, mask, ACCUMULATE)
        key = _magnitude_key(a, KEY_MASK)
        match = mask & ((key >> (SHIFT + WIDTH)) == prefix)
        digit = (key >> SHIFT) & (NBINS - 1)
        hist += tl.histogram(digit, NBINS, mask=match)
    tl.atomic_add(hist_ptr + tl.arange(0, NBINS), hist, sem="relaxed")


@_launch.jit
def _topk_pick_kernel(
    hist_ptr: tl.tensor, state_ptr: tl.tensor, WIDTH: tl.constexpr, NBINS: tl.constexpr
) -> None:
    """One program: the bin holding the k_rem-th largest key extends the prefix; k_rem
    drops by the count in the bins above it."""
    h = tl.load(hist_ptr + tl.arange(0, NBINS)).to(tl.int64)
    prefix = tl.load(state_ptr)
    wanted = tl.load(state_ptr + 1)
    at_or_above = tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h
    digit = tl.sum((at_or_above >= wanted).to(tl.int64), axis=0) - 1
    above = tl.sum(tl.where(tl.arange(0, NBINS) > digit, h, 0), axis=0)
    tl.store(state_ptr, (prefix << WIDTH) | digit)
    tl.store(state_ptr + 1, wanted - above)


@_launch.jit
def _topk_count_kernel(
    grad_ptr: tl.tensor,
    acc_ptr: tl.tensor,
    state_ptr: tl.tensor,
    above_ptr: tl.tensor,
    tied_ptr: tl.tensor,
    n: tl.tensor,
    ACCUMULATE: tl.constexpr,
    KEY_MASK: tl.constexpr,
    BLOCK: tl.constexpr,
) -> None:
    """Per block: how many keys lie above the threshold (state[0]) and how many equal it."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = _accumulate_or_load(grad_ptr, acc_ptr, offs, mask, ACCUMULATE)
    key = _magnitude_key(a, KEY_MASK)
    threshold = tl.load(state_ptr).to(tl.int32)
    above = mask & (key > threshold)
    tied = mask & (key == threshold)
    tl.store(above_ptr + pid, tl.sum(above.to(tl.int32), axis=0).to(tl.int64))
    tl.store(tied_ptr + pid, tl.sum(tied.to(tl.int32), axis=0).to(tl.int64))


@_launch.jit
def _topk_write_kernel(
    acc_ptr: tl.tensor,
    values_ptr: tl.tensor,
    indices_ptr: tl.tensor,
    state_ptr: tl.tensor,
    above_offset_ptr: tl.tensor,
    tied_offset_ptr: tl.tensor,
    n: tl.tensor,
    KEY_MASK: tl.constexpr,
    BLOCK: tl.constexpr,
) -> None:
    """Compaction: keys above the threshold and the first state[1] tied keys (by index)
    go to values/indices in index order and are zeroed in the accumulator."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(acc_ptr + offs, mask=mask, other=0.0)
    key = _magnitude_key(a, KEY_MASK)
    threshold = tl.load(state_ptr).to(tl.int32)
    wanted_ties = tl.load(state_ptr + 1)
    above = mask & (key > threshold)
    tied = mask & (key == threshold)
    tied_before = tl.load(tied_offset_ptr + pid)
    tie_rank = tied_before + tl.cumsum(tied.to(tl.int32), axis=0).to(tl.int64) - 1
    take = above | (tied & (tie_rank < wanted_ties))
    base = tl.load(above_offset_ptr + pid) + tl.minimum(tied_before, wanted_ties)
    position = base + tl.cumsum(take.to(tl.int32), axis=0).to(tl.int64) - 1
    tl.store(values_ptr + position, a, mask=take)
    tl.store(indices_ptr + position, offs, mask=take)
    tl.store(acc_ptr + offs, tl.zeros_like(a), mask=take)


def _exclusive_cumsum(counts: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(counts, 0) - counts


def _topk_triton(
    grad: torch.Tensor, acc: torch.Tensor, k: int, ratio: float, exact: bool, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    n = acc.numel()
    device = acc.device
    if k == 0:
        return acc.new_empty(0), torch.empty(0, dtype=torch.int64, device=device)
    key_mask = _KEY_MASK[acc.dtype]
    block = _launch.block(_BLOCK)
    (num_blocks,) = _launch.grid(n, block)
    above = torch.empty(num_blocks, dtype=torch.int64, device=device)
    tied = torch.empty(num_blocks, dtype=torch.int64, device=device)
    accumulated = False

    def count(state: torch.Tensor, accumulate: bool) -> None:
        _topk_count_kernel[(num_blocks,)](
            grad, acc, state, above, tied, n,
            ACCUMULATE=accumulate, KEY_MASK=key_mask, BLOCK=block, num_warps=_NUM_WARPS,
        )  # fmt: skip

    def write(state: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
        values = acc.new_empty(total)
        indices = torch.empty(total, dtype=torch.int64, device=device)
        _topk_write_kernel[(num_blocks,)](
            acc, values, indices, state, _exclusive_cumsum(above), _exclusive_cumsum(tied), n,
            KEY_MASK=key_mask, BLOCK=block, num_warps=_NUM_WARPS,
        )  # fmt: skip
        return values, indices

    size = None if exact else _sample_size(n, ratio)
    if size is not None:
        threshold = _sample_threshold(grad, acc, size, ratio, seed)
        # Select every key >= threshold: all ties taken.
        state = torch.full((2,), n, dtype=torch.int64, device=device)
        state[0] = threshold
        count(state, accumulate=True)
        accumulated = True
        total = int(above.sum() + tied.sum())
        if _within_tolerance(total, k):
            return write(state, total)

    # Filled on the device: copying a host list would wait for the GPU's queued work.
    state = torch.full((2,), k, dtype=torch.int64, device=device)
    state[0] = 0
    digits = _DIGITS[key_mask]
    hist = torch.zeros(sum(1 << width for _, width in digits), dtype=torch.int32, device=device)
    programs = _launch.persistent_programs(num_blocks, device)
    start = 0
    for i, (shift, width) in enumerate(digits):
        bins = hist[start : start + (1 << width)]
        start += 1 << width
        _topk_hist_kernel[(programs,)](
            grad, acc, state, bins, n,
            ACCUMULATE=i == 0 and not accumulated, KEY_MASK=key_mask, SHIFT=shift,
            WIDTH=width, NBINS=1 << width, BLOCK=block, num_warps=_NUM_WARPS,
        )  # fmt: skip
        _topk_pick_kernel[(1,)](bins, state, WIDTH=width, NBINS=1 << width, num_warps=_NUM_WARPS)
    count(state, accumulate=False)
    return write(state, k)


def topk_compress(
    grad: torch.Tensor,
    residual: torch.Tensor,
    ratio: float,
    *,
    exact: bool = True,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Select the top ``ratio`` of ``grad + residual`` by magnitude, with error feedback.

    Args:
        grad: the gradient (float32, bfloat16 or float16; any shape, read flattened).
        residual: the error-feedback buffer, same shape, dtype and device as ``grad`` and
            contiguous; on return it holds ``grad + residual`` with the selected entries
            zeroed.
        ratio: the share of entries to send, in (0, 1]; k = ``topk_count(grad.numel(),
            ratio)``.
        exact: exactly k entries (True) or sampled threshold selection (False: within
            ±10 % of k).
        seed: the sample of sampled selection.

    Returns:
        ``(values, indices)``: values in ``grad``'s dtype, int64 flat indices ascending.
    """
    k = _check(grad, residual, ratio)
    used = _launch.resolve(grad.device)
    _launch.record(used)
    if used == "reference":
        return topk_compress_reference(grad, residual, ratio, exact=exact, seed=seed)
    return _topk_triton(grad.contiguous().view(-1), residual.view(-1), k, float(ratio), exact, seed)
