"""The comparison helpers of the kernel tests say where results differ."""

from __future__ import annotations

import pytest
import torch
from kernels_helpers import assert_close_report, assert_same_bits


def test_assert_close_report_names_the_first_mismatches_and_the_largest_errors() -> None:
    expected = torch.zeros(10)
    actual = expected.clone()
    actual[3] = 0.5
    actual[7] = -2.0
    with pytest.raises(AssertionError) as failure:
        assert_close_report(actual, expected, atol=0.1, rtol=0.0, name="out")
    message = str(failure.value)
    assert "out: 2 of 10 elements differ" in message
    assert "max abs error 2" in message
    assert "[3] actual 0.5 expected 0.0" in message
    assert "[7] actual -2.0 expected 0.0" in message


def test_assert_close_report_accepts_tolerance_nan_and_signed_zero() -> None:
    expected = torch.tensor([1.0, float("nan"), 0.0, float("inf")])
    actual = torch.tensor([1.0 + 1e-7, float("nan"), -0.0, float("inf")])
    assert_close_report(actual, expected, atol=0.0, rtol=1e-6, name="x")
    with pytest.raises(AssertionError, match="1 of 4"):
        assert_close_report(actual, expected, atol=0.0, rtol=0.0, name="x")


def test_assert_same_bits_tells_signed_zeros_apart() -> None:
    assert_same_bits(torch.tensor([0.0, 1.5]), torch.tensor([0.0, 1.5]), name="x")
    with pytest.raises(AssertionError, match=r"\[0\] -0.0 \(0x80000000\) vs 0.0 \(0x0\)"):
        assert_same_bits(torch.tensor([-0.0, 1.5]), torch.tensor([0.0, 1.5]), name="x")
