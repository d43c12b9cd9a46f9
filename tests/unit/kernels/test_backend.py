"""Which implementation runs: the launcher's choice, forcing it, running without Triton,
and compiling every kernel for a GPU without one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from autotune.kernels import backend, quantize_blockwise, topk_compress, use_backend
from autotune.kernels._launch import interpreting, triton_available


def run_python(code: str, cwd: Path, **env: str | None) -> str:
    """Run code in a fresh interpreter (so Triton is imported anew), outside the checkout so
    the installed package is the one imported; returns stdout."""
    environment = dict(os.environ)
    for key, value in env.items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


needs_interpreter = pytest.mark.skipif(
    not interpreting(), reason="the test run was started with TRITON_INTERPRET=0"
)


@needs_interpreter
def test_the_interpreter_runs_cpu_tensors_and_every_call_records_its_backend() -> None:
    x = torch.zeros(4)
    assert backend(x) == backend("cpu") == backend(torch.device("cpu")) == "triton-interpreter"
    quantize_blockwise(x)
    assert backend() == "triton-interpreter"
    with use_backend("reference"):
        assert backend(x) == "reference"
        quantize_blockwise(x)
        assert backend() == "reference"
    assert backend(x) == "triton-interpreter"
    with use_backend("triton"):
        topk_compress(x, torch.zeros(4), 0.5)
    assert backend() == "triton-interpreter"


def test_an_unknown_backend_choice_is_refused() -> None:
    with pytest.raises(ValueError, match="backend choice must be one of"), use_backend("cuda"):  # type: ignore[arg-type]
        pass


@pytest.mark.subprocess
def test_without_the_interpreter_cpu_tensors_take_the_reference(tmp_path: Path) -> None:
    out = run_python(
        """
        import torch
        from autotune.kernels import backend, quantize_blockwise, use_backend
        x = torch.randn(300)
        print(backend(), backend(x))
        q, scales, nonfinite = quantize_blockwise(x, 128, "fp8_e4m3")
        print(backend(), q.dtype, tuple(scales.shape))
        try:
            with use_backend("triton"):
                quantize_blockwise(x)
        except ValueError as error:
            print(error)
        """,
        tmp_path,
        TRITON_INTERPRET=None,
    )
    lines = out.splitlines()
    assert lines[0] == "reference reference"
    assert lines[1] == "reference torch.float8_e4m3fn (3,)"
    expected = "Triton cannot run here: " + (
        "tensors on cpu need TRITON_INTERPRET=1" if triton_available() else "Triton is not"
    )
    assert expected in lines[2]


@pytest.mark.subprocess
def test_without_triton_everything_takes_the_reference(tmp_path: Path) -> None:
    out = run_python(
        """
        import sys
        sys.modules["triton"] = None  # as where no Triton wheel exists: import fails
        import torch
        from autotune.kernels import (
            backend, dequantize_blockwise, layernorm_gelu, quantize_blockwise,
            scatter_add_decompress, topk_compress,
        )
        grad, residual = torch.randn(1000), torch.zeros(1000)
        values, indices = topk_compress(grad, residual, 0.1)
        scatter_add_decompress(values, indices, residual)
        q, scales, _ = quantize_blockwise(grad)
        dequantize_blockwise(q, scales)
        layernorm_gelu(torch.randn(3, 8), torch.ones(8), torch.zeros(8))
        print(backend(), backend(grad), torch.equal(residual, grad), sys.modules["triton"] is None)
        """,
        tmp_path,
        TRITON_INTERPRET="1",
    )
    assert out.split() == ["reference", "reference", "True", "True"]


COMPILE_ALL = """
import importlib
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from autotune.kernels import _launch, quantize, scatter, topk

lg = importlib.import_module("autotune.kernels.layernorm_gelu")  # the name is the function's

assert not _launch.interpreting()
cases = [(topk._topk_pick_kernel, {"hist_ptr": "*i32", "state_ptr": "*i64"},
          {"WIDTH": 11, "NBINS": 2048})]
for dt in ("fp32", "bf16", "fp16"):
    mask = 0x7FFFFFFF if dt == "fp32" else 0x7FFF
    shift, width = (20, 11) if dt == "fp32" else (8, 7)
    for acc in (True, False):
        cases.append((topk._topk_hist_kernel,
            {"grad_ptr": f"*{dt}", "acc_ptr": f"*{dt}", "state_ptr": "*i64",
             "hist_ptr": "*i32", "n": "i64"},
            {"ACCUMULATE": acc, "KEY_MASK": mask, "SHIFT": shift, "WIDTH": width,
             "NBINS": 1 << width, "BLOCK": 4096}))
        cases.append((topk._topk_count_kernel,
            {"grad_ptr": f"*{dt}", "acc_ptr": f"*{dt}", "state_ptr": "*i64",
             "above_ptr": "*i64", "tied_ptr": "*i64", "n": "i64"},
            {"ACCUMULATE": acc, "KEY_MASK": mask, "BLOCK": 4096}))
    cases.append((topk._topk_write_kernel,
        {"acc_ptr": f"*{dt}", "values_ptr": f"*{dt}", "indices_ptr": "*i64",
         "state_ptr": "*i64", "above_offset_ptr": "*i64", "tied_offset_ptr": "*i64",
         "n": "i64"},
        {"KEY_MASK": mask, "BLOCK": 4096}))
    cases.append((scatter._scatter_add_kernel,
        {"values_ptr": f"*{dt}", "indices_ptr": "*i64", "acc_ptr": "*fp32", "k": "i32"},
        {"BLOCK": 1024}))
    for fp8 in (True, False):
        for stochastic in (True, False):
            cases.append((quantize._quantize_kernel,
                {"x_ptr": f"*{dt}", "q_ptr": "*i8", "scales_ptr": "*fp32",
                 "nonfinite_ptr": "*i32", "n": "i64", "num_blocks": "i32", "seed": "i32"},
                {"BLOCK_SIZE": 128, "BLOCK_P2": 128, "ROWS": 32, "FP8": fp8,
                 "STOCHASTIC": stochastic, "HW_CAST": True}))
        cases.append((quantize._dequantize_kernel,
            {"q_ptr": "*i8", "scales_ptr": "*fp32", "out_ptr": f"*{dt}", "n": "i64"},
            {"BLOCK_SIZE": 128, "BLOCK": 4096, "FP8": fp8}))
    for tanh in (True, False):
        cases.append((lg._forward_kernel,
            {"x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "b_ptr": f"*{dt}", "out_ptr": f"*{dt}",
             "mean_ptr": "*fp32", "rstd_ptr": "*fp32", "rows": "i32", "N": "i32",
             "eps": "fp32"},
            {"BLOCK_N": 1024, "ROWS": 4, "TANH": tanh}))
        cases.append((lg._backward_kernel,
            {"dout_ptr": f"*{dt}", "x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "b_ptr": f"*{dt}",
             "mean_ptr": "*fp32", "rstd_ptr": "*fp32", "dx_ptr": f"*{dt}",
             "dw_part_ptr": "*fp32", "db_part_ptr": "*fp32", "rows": "i32", "N": "i32"},
            {"BLOCK_N": 1024, "ROWS": 4, "TANH": tanh}))
for fn, signature, constants in cases:
    signature = {**signature, **{name: "constexpr" for name in constants}}
    compiled = triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=constants),
        target=GPUTarget("cuda", 90, 32), options={"num_warps": 8},
    )
    assert compiled.asm["cubin"], fn.__name__
print(len(cases))
"""


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(not triton_available(), reason="Triton is not installed")
def test_every_kernel_compiles_for_hopper_without_a_gpu(tmp_path: Path) -> None:
    """The interpreter accepts code the compiler refuses; compiling each kernel variant to
    an sm_90 binary (Triton ships ptxas) checks the GPU path where no GPU is at hand."""
    out = run_python(
        COMPILE_ALL,
        tmp_path,
        TRITON_INTERPRET=None,
        TRITON_CACHE_DIR=str(tmp_path / "cache"),
        TRITON_DEFAULT_FP_FUSION="1",
    )
    assert out.strip() == "49"
