"""Triton kernels for gradient compression and low precision, each with a pure-torch
reference of the same signature. Depends on nothing in the project but torch and Triton.

- ``topk_compress(grad, residual, ratio)``: top-k selection with error feedback;
  ``scatter_add_decompress(values, indices, out)``: its inverse, duplicates summed.
- ``quantize_blockwise(x, block_size, fmt, stochastic)`` /
  ``dequantize_blockwise(q, scales, block_size, out_dtype)``: int8 or fp8 (e4m3), one
  float32 scale per block of 128, non-finite input counted per block.
- ``layernorm_gelu(x, weight, bias, eps, approximate)``: fused, differentiable.

Which implementation runs: compiled Triton for CUDA tensors; Triton's interpreter for
every tensor when Triton was imported with ``TRITON_INTERPRET=1`` (set it before anything
imports Triton); the reference otherwise, and wherever Triton is not installed.
``backend()`` says which one the last call in this thread used, ``backend(tensor)`` which
one a call on that tensor would use, and ``use_backend("reference" | "triton" | "auto")``
forces the choice within a ``with`` block.
"""

from autotune.kernels._launch import Backend, backend, use_backend
from autotune.kernels.layernorm_gelu import (
    MAX_FUSED_N,
    layernorm_gelu,
    layernorm_gelu_reference,
)
from autotune.kernels.quantize import (
    Format,
    dequantize_blockwise,
    dequantize_blockwise_reference,
    quantize_blockwise,
    quantize_blockwise_reference,
)
from autotune.kernels.scatter import scatter_add_decompress, scatter_add_decompress_reference
from autotune.kernels.topk import topk_compress, topk_compress_reference, topk_count

__all__ = [
    "MAX_FUSED_N",
    "Backend",
    "Format",
    "backend",
    "dequantize_blockwise",
    "dequantize_blockwise_reference",
    "layernorm_gelu",
    "layernorm_gelu_reference",
    "quantize_blockwise",
    "quantize_blockwise_reference",
    "scatter_add_decompress",
    "scatter_add_decompress_reference",
    "topk_compress",
    "topk_compress_reference",
    "topk_count",
    "use_backend",
]
