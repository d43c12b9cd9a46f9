"""Triton kernels for gradient compression and low precision, each with a pure-torch
reference of the same signature. Depends on nothing in the project but torch and Triton.

Each launcher runs compiled Triton on CUDA tensors, Triton's interpreter when Triton was
imported with ``TRITON_INTERPRET=1`` (CPU tensors included), and the reference otherwise
(and wherever Triton is not installed). ``backend()`` says which one the last call used,
``backend(tensor)`` which one a call on that tensor would use, and
``use_backend("reference" | "triton" | "auto")`` forces the choice within a ``with`` block.
"""

from autotune.kernels._launch import Backend, backend, use_backend
from autotune.kernels.topk import topk_compress, topk_compress_reference, topk_count

__all__ = [
    "Backend",
    "backend",
    "topk_compress",
    "topk_compress_reference",
    "topk_count",
    "use_backend",
]
