"""topk_compress: error feedback loses nothing, selection is by magnitude, the Triton path
returns what the reference returns."""

from __future__ import annotations

import math

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
    assert_same_bits,
    path,
)

from autotune.kernels import backend, topk_compress, topk_compress_reference, topk_count

RATIO = 0.01


def make_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A gradient and a residual with magnitudes over several decades and exact ties."""
    g = torch.Generator().manual_seed(seed)
    grad = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g))
    residual = 0.1 * torch.randn(shape, generator=g)
    flat = grad.view(-1)
    if flat.numel() > 10:
        flat[::7] = 0.75  # many entries tied in magnitude (and sign)
        flat[1::11] = -0.75
    return grad.to(dtype).to(DEVICE), residual.to(dtype).to(DEVICE)


def check_compression(
    grad: torch.Tensor,
    old_residual: torch.Tensor,
    residual: torch.Tensor,
    values: torch.Tensor,
    indices: torch.Tensor,
    k: int,
    exact: bool,
) -> None:
    n = grad.numel()
    acc = (grad + old_residual).reshape(-1)
    assert indices.dtype == torch.int64
    assert values.dtype == grad.dtype
    if exact:
        assert indices.numel() == k
    else:
        assert abs(indices.numel() - k) <= 0.1 * k, (indices.numel(), k)
    if indices.numel() > 1:
        assert bool((indices[1:] > indices[:-1]).all()), "indices not strictly ascending"
    assert int(indices.min()) >= 0
    assert int(indices.max()) < n
    # values are the accumulator at the indices, and nothing is lost:
    assert_same_bits(values, acc[indices], name="values")
    restored = residual.reshape(-1).clone()
    assert bool((restored[indices] == 0).all()), "selected entries not zeroed in the residual"
    restored.index_put_((indices,), values, accumulate=True)
    assert_close_report(restored, acc, atol=0.0, rtol=0.0, name="scatter + residual")
    # every selected magnitude is at least every unselected one:
    selected = torch.zeros(n, dtype=torch.bool, device=acc.device)
    selected[indices] = True
    magnitude = acc.float().abs()
    if bool((~selected).any()):
        assert float(magnitude[selected].min()) >= float(magnitude[~selected].max())


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "sampled"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("which", PATHS)
def test_error_feedback_conserves_and_selects_the_largest(
    which: str, dtype: torch.dtype, shape: tuple[int, ...], exact: bool
) -> None:
    grad, residual = make_inputs(shape, dtype)
    old_residual = residual.clone()
    k = topk_count(grad.numel(), RATIO)
    with path(which) as expected_backend:
        values, indices = topk_compress(grad, residual, RATIO, exact=exact, seed=3)
    assert backend() == expected_backend
    check_compression(grad, old_residual, residual, values, indices, k, exact)
    if which == "kernel":
        # Same entries, same bits as the reference: ties go to the lowest indices on every
        # backend, and the sampled threshold comes from the same sample.
        ref_residual = old_residual.clone()
        ref_values, ref_indices = topk_compress_reference(
            grad, ref_residual, RATIO, exact=exact, seed=3
        )
        assert torch.equal(indices, ref_indices)
        assert_same_bits(values, ref_values, name="values vs reference")
        assert_same_bits(residual, ref_residual, name="residual vs reference")


@pytest.mark.parametrize("which", PATHS)
def test_error_feedback_over_steps_sends_every_gradient_eventually(which: str) -> None:
    """Each step conserves grad + residual; after a step with ratio 1 nothing is left."""
    residual = torch.zeros(4097, device=DEVICE)
    with path(which):
        for step in range(5):
            grad, _ = make_inputs((4097,), torch.float32, seed=step)
            before = residual.clone()
            values, indices = topk_compress(grad, residual, 0.05)
            check_compression(grad, before, residual, values, indices, 205, exact=True)
        values, indices = topk_compress(torch.zeros_like(residual), residual, 1.0)
    assert indices.numel() == 4097
    assert bool((residual == 0).all())


@pytest.mark.parametrize("which", PATHS)
def test_ties_at_the_threshold_go_to_the_lowest_indices(which: str) -> None:
    grad = torch.tensor([1.0, -2.0, 2.0, 0.5, -2.0, 2.0, 3.0], device=DEVICE)
    residual = torch.zeros_like(grad)
    with path(which):
        values, indices = topk_compress(grad, residual, 3 / 7)
    assert indices.tolist() == [1, 2, 6]
    assert values.tolist() == [-2.0, 2.0, 3.0]
    assert residual.tolist() == [1.0, 0.0, 0.0, 0.5, -2.0, 2.0, 0.0]


@pytest.mark.parametrize("which", PATHS)
def test_nan_counts_as_the_largest_magnitude(which: str) -> None:
    grad = torch.tensor([1.0, float("nan"), -3.0, float("inf"), 2.0], device=DEVICE)
    residual = torch.zeros_like(grad)
    with path(which):
        values, indices = topk_compress(grad, residual, 0.6)
    assert indices.tolist() == [1, 2, 3]
    assert math.isnan(values[0].item())
    assert values[1:].tolist() == [-3.0, float("inf")]
    assert residual.tolist() == [1.0, 0.0, 0.0, 0.0, 2.0]


@pytest.mark.parametrize("which", PATHS)
def test_two_dimensional_input_gives_flat_indices(which: str) -> None:
    grad = torch.zeros(3, 5, device=DEVICE)
    grad[2, 4] = 9.0
    grad[1, 0] = -8.0
    residual = torch.zeros_like(grad)
    with path(which):
        values, indices = topk_compress(grad, residual, 2 / 15)
    assert indices.tolist() == [5, 14]
    assert values.tolist() == [-8.0, 9.0]


@pytest.mark.parametrize("which", PATHS)
def test_an_empty_gradient_selects_nothing(which: str) -> None:
    grad = torch.empty(0, device=DEVICE)
    with path(which):
        values, indices = topk_compress(grad, torch.empty(0, device=DEVICE), 0.5)
    assert values.numel() == 0
    assert indices.numel() == 0
    assert indices.dtype == torch.int64


@pytest.mark.parametrize("which", PATHS)
def test_sampled_selection_falls_back_to_exact_when_the_sample_misses(which: str) -> None:
    """Every entry ties: the sampled threshold would select all; the count rule restores k.
    (500,000 entries: large enough for a sample of 102,400 to be taken at ratio 0.01.)"""
    grad = torch.ones(500_000, device=DEVICE)
    residual = torch.zeros_like(grad)
    with path(which):
        _values, indices = topk_compress(grad, residual, 0.01, exact=False)
    assert indices.numel() == 5000
    assert torch.equal(indices.cpu(), torch.arange(5000))


@pytest.mark.parametrize(
    ("numel", "ratio", "k"),
    [(300, 0.01, 3), (100, 0.01, 1), (101, 0.01, 2), (10, 0.3, 3), (7, 1.0, 7), (5, 1e-9, 1)],
)
def test_topk_count_is_ceil_of_ratio_times_numel(numel: int, ratio: float, k: int) -> None:
    assert topk_count(numel, ratio) == k


def test_bad_arguments_are_refused_with_the_reason() -> None:
    grad = torch.zeros(8)
    with pytest.raises(ValueError, match=r"ratio must be in \(0, 1\]"):
        topk_compress(grad, torch.zeros(8), 0.0)
    with pytest.raises(ValueError, match=r"ratio must be in \(0, 1\]"):
        topk_compress(grad, torch.zeros(8), 1.5)
    with pytest.raises(ValueError, match=r"ratio must be in \(0, 1\]"):
        topk_compress(grad, torch.zeros(8), float("nan"))
    with pytest.raises(TypeError, match="ratio must be a number"):
        topk_compress(grad, torch.zeros(8), True)
    with pytest.raises(ValueError, match=r"residual shape \(4, 2\) != grad shape \(8,\)"):
        topk_compress(grad, torch.zeros(4, 2), 0.5)
    with pytest.raises(ValueError, match=r"residual is torch\.bfloat16, grad is torch\.float32"):
        topk_compress(grad, torch.zeros(8, dtype=torch.bfloat16), 0.5)
    with pytest.raises(ValueError, match="not float32/bfloat16/float16"):
        topk_compress(grad.long(), torch.zeros(8).long(), 0.5)
    with pytest.raises(ValueError, match="residual must be contiguous"):
        topk_compress(torch.zeros(4, 2), torch.zeros(2, 4).t(), 0.5)
    with pytest.raises(ValueError, match="must not share memory"):
        topk_compress(grad, grad, 0.5)
