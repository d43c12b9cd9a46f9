"""LayerNorm over the last dimension followed by GELU, fused, forward and backward.

``layernorm_gelu(x, weight, bias, eps, approximate)`` equals
``F.gelu(F.layer_norm(x, (N,), weight, bias, eps), approximate=approximate)`` computed in
float32 and rounded once to ``x``'s dtype (the reference does exactly that). GELU is exact
(``approximate="none"``, with erf) or the tanh approximation (``"tanh"``).

The forward kernel keeps each row's mean and 1/std (float32) for the backward, which
recomputes the LayerNorm output instead of storing it, and returns the gradients of
``x``, ``weight`` and ``bias`` in their own dtypes. ``weight`` and ``bias`` may be float32
while ``x`` is 16-bit. A row is held whole in one program, so rows longer than
``MAX_FUSED_N`` elements take the reference.
"""

from __future__ import annotations

import math
from typing import Any, Final, Literal, get_args

import torch

from autotune.kernels import _launch
from autotune.kernels._launch import cast_rne, tl

__all__ = ["MAX_FUSED_N", "Approximate", "layernorm_gelu", "layernorm_gelu_reference"]

Approximate = Literal["none", "tanh"]

MAX_FUSED_N: Final = 1 << 16
_FLOATS: Final = (torch.float32, torch.bfloat16, torch.float16)
_TILE: Final = 4096  # compiled; see _launch.block
_SQRT_2_OVER_PI: Final = _launch.constexpr(math.sqrt(2 / math.pi))
_INV_SQRT_2: Final = _launch.constexpr(1 / math.sqrt(2))
_INV_SQRT_2PI: Final = _launch.constexpr(1 / math.sqrt(2 * math.pi))
_TANH_CUBIC: Final = _launch.constexpr(0.044715)


def _check(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, approximate: str
) -> None:
    if not all(isinstance(t, torch.Tensor) for t in (x, weight, bias)):
        raise TypeError("layernorm_gelu: x, weight and bias must be tensors")
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t.dtype not in _FLOATS:
            raise ValueError(
                f"layernorm_gelu: {name} dtype {t.dtype} is not float32/bfloat16/float16"
            )
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"layernorm_gelu: x needs a non-empty last dimension, not {x.shape}")
    n = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t.shape != (n,):
            raise ValueError(
                f"layernorm_gelu: {name} shape {tuple(t.shape)} != ({n},), x's last dimension"
            )
    if not x.device == weight.device == bias.device:
        raise ValueError(
            f"layernorm_gelu: x on {x.device}, weight on {weight.device}, bias on {bias.device}"
        )
    if isinstance(eps, bool) or not isinstance(eps, int | float):
        raise TypeError(f"layernorm_gelu: eps must be a number, not {type(eps).__name__}")
    if not 0 < eps < math.inf:
        raise ValueError(f"layernorm_gelu: eps must be positive and finite, not {eps}")
    if approximate not in get_args(Approximate):
        raise ValueError(
            f"layernorm_gelu: approximate must be one of {get_args(Approximate)}, "
            f"not {approximate!r}"
        )


def layernorm_gelu_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    approximate: Approximate = "none",
) -> torch.Tensor:
    """Pure-torch ``layernorm_gelu`` (``F.layer_norm`` then ``F.gelu`` in float32; autograd
    gives the backward)."""
    _check(x, weight, bias, eps, approximate)
    normed = torch.nn.functional.layer_norm(
        x.float(), (x.shape[-1],), weight.float(), bias.float(), eps
    )
    return torch.nn.functional.gelu(normed, approximate=approximate).to(x.dtype)


@_launch.jit
def _tanh(u: tl.tensor) -> tl.tensor:
    e = tl.exp(-2.0 * tl.abs(u))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(u < 0.0, -t, t)


# Module constants stand right of a tensor in the expressions below: the interpreter
# cannot multiply a constexpr on the left by a tensor.


@_launch.jit
def _gelu(y: tl.tensor, TANH: tl.constexpr) -> tl.tensor:
    if TANH:
        g = 0.5 * y * (1.0 + _tanh((y + y * y * y * _TANH_CUBIC) * _SQRT_2_OVER_PI))
    else:
        g = 0.5 * y * (1.0 + tl.math.erf(y * _INV_SQRT_2))
    return g


@_launch.jit
def _gelu_grad(y: tl.tensor, TANH: tl.constexpr) -> tl.tensor:
    if TANH:
        t = _tanh((y + y * y * y * _TANH_CUBIC) * _SQRT_2_OVER_PI)
        du = (1.0 + y * y * _TANH_CUBIC * 3.0) * _SQRT_2_OVER_PI
        d = 0.5 * (1.0 + t) + 0.5 * y * (1.0 - t * t) * du
    else:
        d = 0.5 * (1.0 + tl.math.erf(y * _INV_SQRT_2)) + y * _INV_SQRT_2PI * tl.exp(-0.5 * y * y)
    return d


@_launch.jit
def _forward_kernel(
    x_ptr: tl.tensor,
    w_ptr: tl.tensor,
    b_ptr: tl.tensor,
    out_ptr: tl.tensor,
    mean_ptr: tl.tensor,
    rstd_ptr: tl.tensor,
    rows: tl.tensor,
    N: tl.tensor,
    eps: tl.tensor,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    TANH: tl.constexpr,
) -> None:
    """ROWS whole rows per program."""
    pid = tl.program_id(0)
    r = pid.to(tl.int64) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK_N)
    row_mask = r < rows
    col_mask = c < N
    mask = row_mask[:, None] & col_mask[None, :]
    offs = r[:, None] * N + c[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / N
    centred = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / N + eps)
    w = tl.load(w_ptr + c, mask=col_mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + c, mask=col_mask, other=0.0).to(tl.float32)
    y = centred * rstd[:, None] * w[None, :] + b[None, :]
    out = _gelu(y, TANH)
    tl.store(out_ptr + offs, cast_rne(out, out_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + r, mean, mask=row_mask)
    tl.store(rstd_ptr + r, rstd, mask=row_mask)


@_launch.jit
def _backward_kernel(
    dout_ptr: tl.tensor,
    x_ptr: tl.tensor,
    w_ptr: tl.tensor,
    b_ptr: tl.tensor,
    mean_ptr: tl.tensor,
    rstd_ptr: tl.tensor,
    dx_ptr: tl.tensor,
    dw_part_ptr: tl.tensor,
    db_part_ptr: tl.tensor,
    rows: tl.tensor,
    N: tl.tensor,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    TANH: tl.constexpr,
) -> None:
    """dx per row; each program sums dweight and dbias over the rows it visits into its
    own row of the partial buffers (summed by the launcher)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    c = tl.arange(0, BLOCK_N)
    col_mask = c < N
    w = tl.load(w_ptr + c, mask=col_mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + c, mask=col_mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(pid.to(tl.int64) * ROWS, rows, nprog * ROWS):
        r = start + tl.arange(0, ROWS)
        row_mask = r < rows
        mask = row_mask[:, None] & col_mask[None, :]
        offs = r[:, None] * N + c[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dout = tl.load(dout_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + r, mask=row_mask, other=0.0)
        rstd = tl.load(rstd_ptr + r, mask=row_mask, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        y = xhat * w[None, :] + b[None, :]
        dy = tl.where(mask, dout * _gelu_grad(y, TANH), 0.0)
        dxhat = dy * w[None, :]
        c1 = tl.sum(xhat * dxhat, axis=1) / N
        c2 = tl.sum(dxhat, axis=1) / N
        dx = (dxhat - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(dx_ptr + offs, cast_rne(dx, dx_ptr.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * xhat, axis=0)
        db += tl.sum(dy, axis=0)
    tl.store(dw_part_ptr + pid * N + c, dw, mask=col_mask)
    tl.store(db_part_ptr + pid * N + c, db, mask=col_mask)


def _tiling(n: int) -> tuple[int, int, int]:
    """(BLOCK_N, ROWS, num_warps) for rows of n elements."""
    block_n, rows = _launch.tile_rows(n, _TILE)
    return block_n, rows, _launch.num_warps(block_n * rows)


class _LayerNormGelu(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        eps: float,
        approximate: Approximate,
    ) -> torch.Tensor:
        n = x.shape[-1]
        x2 = x.reshape(-1, n).contiguous()
        rows = x2.shape[0]
        out = torch.empty_like(x2)
        mean = torch.empty(rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        if rows:
            block_n, tile_rows, num_warps = _tiling(n)
            _forward_kernel[_launch.grid(rows, tile_rows)](
                x2, weight.contiguous(), bias.contiguous(), out, mean, rstd, rows, n,
                float(eps), BLOCK_N=block_n, ROWS=tile_rows, TANH=approximate == "tanh",
                num_warps=num_warps,
            )  # fmt: skip
        ctx.save_for_backward(x2, weight, bias, mean, rstd)
        ctx.tanh = approximate == "tanh"
        ctx.x_shape = x.shape
        return out.view(x.shape)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x2, weight, bias, mean, rstd = ctx.saved_tensors
        rows, n = x2.shape
        block_n, tile_rows, num_warps = _tiling(n)
        (tiles,) = _launch.grid(rows, tile_rows)
        programs = _launch.persistent_programs(tiles, x2.device)
        dx = torch.empty_like(x2)
        dw_part = torch.zeros(programs, n, dtype=torch.float32, device=x2.device)
        db_part = torch.zeros(programs, n, dtype=torch.float32, device=x2.device)
        if rows:
            _backward_kernel[(programs,)](
                dout.reshape(rows, n).contiguous(), x2, weight.contiguous(), bias.contiguous(),
                mean, rstd, dx, dw_part, db_part, rows, n, BLOCK_N=block_n, ROWS=tile_rows,
                TANH=ctx.tanh, num_warps=num_warps,
            )  # fmt: skip
        dweight = dw_part.sum(0).to(weight.dtype)
        dbias = db_part.sum(0).to(bias.dtype)
        return dx.view(ctx.x_shape), dweight, dbias, None, None


def layernorm_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    approximate: Approximate = "none",
) -> torch.Tensor:
    """GELU of the LayerNorm of ``x`` over its last dimension, differentiable.

    Args:
        x: float32, bfloat16 or float16, any shape with a non-empty last dimension N.
        weight, bias: shape (N,), any of those dtypes.
        eps: added to the variance, positive.
        approximate: ``"none"`` (erf) or ``"tanh"``, as in ``F.gelu``.

    Returns:
        A tensor of ``x``'s shape and dtype.
    """
    _check(x, weight, bias, eps, approximate)
    used = _launch.resolve(x.device)
    if x.shape[-1] > MAX_FUSED_N:
        used = "reference"
    _launch.record(used)
    if used == "reference":
        return layernorm_gelu_reference(x, weight, bias, eps, approximate)
    apply: Any = _LayerNormGelu.apply  # torch leaves Function.apply untyped
    out: torch.Tensor = apply(x, weight, bias, float(eps), approximate)
    return out
