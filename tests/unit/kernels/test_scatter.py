"""scatter_add_decompress: duplicates summed, and top-k values go back where they came
from."""

from __future__ import annotations

import pytest
import torch
from kernels_helpers import (
    DEVICE,
    DTYPE_IDS,
    DTYPES,
    PATHS,
    SHAPE_IDS,
    SHAPES,
    assert_close_report,
    path,
)

from autotune.kernels import (
    backend,
    scatter_add_decompress,
    scatter_add_decompress_reference,
    topk_compress,
)


def duplicated_indices(n: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """Random indices into n entries with every one of the first few repeated, as after an
    all-gather from several ranks."""
    indices = torch.randint(0, n, (count,), generator=generator)
    repeated = indices[: max(1, count // 4)]
    return torch.cat([indices, repeated, repeated]).to(DEVICE)


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("which", PATHS)
def test_duplicates_are_summed_exactly(
    which: str, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    """Small integers: every sum is exact in every dtype, whatever the order of additions."""
    g = torch.Generator().manual_seed(1)
    n = torch.Size(shape).numel()
    out = torch.randint(-8, 9, shape, generator=g).to(dtype).to(DEVICE)
    indices = duplicated_indices(n, min(n, 50_000), g)
    values = torch.randint(-3, 4, (indices.numel(),), generator=g).to(dtype).to(DEVICE)
    expected = out.double().reshape(-1).index_add(0, indices, values.double())
    with path(which) as expected_backend:
        returned = scatter_add_decompress(values, indices, out)
    assert backend() == expected_backend
    assert returned is out
    assert_close_report(out.reshape(-1), expected, atol=0.0, rtol=0.0, name="out")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_kernel_matches_the_reference_on_random_values(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(2)
    n = 1_000_003
    out = torch.randn(n, generator=g).to(dtype).to(DEVICE)
    indices = duplicated_indices(n, 100_000, g)
    values = torch.randn(indices.numel(), generator=g).to(dtype).to(DEVICE)
    expected = scatter_add_decompress_reference(values, indices, out.clone())
    with path("kernel"):
        scatter_add_decompress(values, indices, out)
    # float32 sums in another order: a few float32 ulps, then one rounding to the dtype.
    tol = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    assert_close_report(out, expected, atol=tol, rtol=tol, name="out")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("which", PATHS)
def test_decompressing_topk_restores_the_accumulated_gradient(
    which: str, dtype: torch.dtype
) -> None:
    g = torch.Generator().manual_seed(3)
    grad = torch.randn(61, 4097, generator=g).to(dtype).to(DEVICE)
    residual = (0.1 * torch.randn(61, 4097, generator=g)).to(dtype).to(DEVICE)
    accumulated = grad + residual
    with path(which):
        values, indices = topk_compress(grad, residual, 0.01)
        scatter_add_decompress(values, indices, residual)
    assert_close_report(residual, accumulated, atol=0.0, rtol=0.0, name="restored")


@pytest.mark.parametrize("which", PATHS)
def test_int32_indices_and_nothing_to_add(which: str) -> None:
    out = torch.zeros(5, device=DEVICE)
    with path(which):
        scatter_add_decompress(
            torch.tensor([1.0, 2.0], device=DEVICE),
            torch.tensor([4, 4], dtype=torch.int32, device=DEVICE),
            out,
        )
        scatter_add_decompress(
            torch.empty(0, device=DEVICE), torch.empty(0, dtype=torch.int64, device=DEVICE), out
        )
    assert out.tolist() == [0.0, 0.0, 0.0, 0.0, 3.0]


def test_bad_arguments_are_refused_with_the_reason() -> None:
    out = torch.zeros(4)
    values = torch.ones(2)
    with pytest.raises(ValueError, match=r"indices span \[0, 4\], outside \[0, 3\]"):
        scatter_add_decompress(values, torch.tensor([0, 4]), out)
    with pytest.raises(ValueError, match=r"indices span \[-1, 0\]"):
        scatter_add_decompress(values, torch.tensor([-1, 0]), out)
    with pytest.raises(ValueError, match=r"values are torch\.float16, out is torch\.float32"):
        scatter_add_decompress(values.half(), torch.tensor([0, 1]), out)
    with pytest.raises(ValueError, match="indices must be int64 or int32"):
        scatter_add_decompress(values, torch.tensor([0.0, 1.0]), out)
    with pytest.raises(ValueError, match="1-D of one length"):
        scatter_add_decompress(values, torch.tensor([0, 1, 2]), out)
    with pytest.raises(ValueError, match="out must be contiguous"):
        scatter_add_decompress(values, torch.tensor([0, 1]), torch.zeros(2, 4).t())
