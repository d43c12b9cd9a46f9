"""layernorm_gelu: output and gradients match LayerNorm then GELU within the dtype's
tolerance."""

from __future__ import annotations

import pytest
import torch
from kernels_helpers import DEVICE, DTYPE_IDS, DTYPES, PATHS, assert_close_report, path

from autotune.kernels import MAX_FUSED_N, backend, layernorm_gelu, layernorm_gelu_reference

# Rows of odd lengths; (7874, 127) holds 1,000,000 elements.
SHAPES = [(1,), (127,), (4097,), (7874, 127), (3, 129), (2, 3, 65)]
SHAPE_IDS = ["1", "127", "4097", "7874x127", "3x129", "2x3x65"]
# Relative to the largest magnitude of the expected tensor: float32 to a few ulps of its
# sums, 16-bit to about one rounding of the output.
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def make_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, param_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n = shape[-1]
    x = (2 * torch.randn(shape, generator=g) + 0.5).to(dtype).to(DEVICE)
    weight = (1 + 0.3 * torch.randn(n, generator=g)).to(param_dtype or dtype).to(DEVICE)
    bias = (0.3 * torch.randn(n, generator=g)).to(param_dtype or dtype).to(DEVICE)
    dout = torch.randn(shape, generator=g).to(dtype).to(DEVICE)
    return x, weight, bias, dout


def run(
    fn: object,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    dout: torch.Tensor,
    approximate: str,
) -> list[torch.Tensor]:
    leaves = [t.detach().clone().requires_grad_() for t in (x, weight, bias)]
    out = fn(*leaves, 1e-5, approximate)  # type: ignore[operator]
    out.backward(dout)
    return [out.detach()] + [t.grad for t in leaves]  # type: ignore[misc]


def assert_matches(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    for name, a, e in zip(("out", "dx", "dweight", "dbias"), actual, expected, strict=True):
        assert a.dtype == e.dtype, f"{name}: {a.dtype} != {e.dtype}"
        tol = TOLERANCE[a.dtype] if a.dtype != torch.float32 else TOLERANCE[actual[0].dtype]
        scale = max(float(e.float().abs().max()), 1.0)
        assert_close_report(a, e, atol=tol * scale, rtol=tol, name=name)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("which", PATHS)
def test_forward_and_backward_match_layer_norm_then_gelu(
    which: str, dtype: torch.dtype, shape: tuple[int, ...], approximate: str
) -> None:
    x, weight, bias, dout = make_inputs(shape, dtype)
    with path(which) as expected_backend:
        actual = run(layernorm_gelu, x, weight, bias, dout, approximate)
    assert backend() == expected_backend
    assert actual[0].shape == x.shape
    assert actual[0].dtype == dtype
    # The reference: F.layer_norm and F.gelu in float32, by autograd.
    expected = run(layernorm_gelu_reference, x, weight, bias, dout, approximate)
    assert_matches(actual, expected)


@pytest.mark.parametrize("which", PATHS)
def test_reference_is_the_unfused_torch_pair_in_float32(which: str) -> None:
    x, weight, bias, _dout = make_inputs((5, 33), torch.float32)
    with path(which):
        out = layernorm_gelu(x, weight, bias, 1e-5, "tanh")
    normed = torch.nn.functional.layer_norm(x, (33,), weight, bias, 1e-5)
    expected = torch.nn.functional.gelu(normed, approximate="tanh")
    assert_close_report(out, expected, atol=1e-5, rtol=1e-5, name="out")


@pytest.mark.parametrize("which", PATHS)
def test_float32_parameters_with_16_bit_activations(which: str) -> None:
    x, weight, bias, dout = make_inputs((9, 257), torch.bfloat16, param_dtype=torch.float32)
    with path(which):
        actual = run(layernorm_gelu, x, weight, bias, dout, "none")
    assert actual[2].dtype == torch.float32
    assert actual[3].dtype == torch.float32
    expected = run(layernorm_gelu_reference, x, weight, bias, dout, "none")
    assert_matches(actual, expected)


def test_rows_longer_than_a_program_holds_take_the_reference() -> None:
    x, weight, bias, dout = make_inputs((2, MAX_FUSED_N + 1), torch.float32)
    with path("kernel"):
        actual = run(layernorm_gelu, x, weight, bias, dout, "none")
    assert backend() == "reference"
    assert_matches(actual, run(layernorm_gelu_reference, x, weight, bias, dout, "none"))


def test_bad_arguments_are_refused_with_the_reason() -> None:
    x = torch.zeros(4, 8)
    w, b = torch.ones(8), torch.zeros(8)
    with pytest.raises(ValueError, match=r"weight shape \(7,\) != \(8,\)"):
        layernorm_gelu(x, torch.ones(7), b)
    with pytest.raises(ValueError, match="approximate must be one of"):
        layernorm_gelu(x, w, b, 1e-5, "sigmoid")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eps must be positive"):
        layernorm_gelu(x, w, b, 0.0)
    with pytest.raises(ValueError, match="non-empty last dimension"):
        layernorm_gelu(torch.zeros(4, 0), torch.ones(0), torch.zeros(0))
    with pytest.raises(ValueError, match=r"x dtype torch\.int64"):
        layernorm_gelu(x.long(), w, b)
