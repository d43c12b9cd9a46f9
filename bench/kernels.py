"""Speed of the kernels against their plain-torch counterparts.

Each kernel (the ``autotune.kernels`` launcher, whichever backend it picks) is timed next
to the unfused torch code a training loop would otherwise run:

- topk_compress (ratio 0.01): ``grad + residual``, ``torch.topk`` of the magnitudes,
  gather, zero the selected entries;
- scatter_add_decompress (4 ranks x 1 % of the entries, duplicates): ``index_add_``;
- quantize / dequantize, int8 and fp8 e4m3, blocks of 128: torch ops over a
  (blocks, 128) view;
- layernorm_gelu (rows of 4096), forward and forward + backward: ``F.layer_norm`` then
  ``F.gelu`` in the input dtype.

GB/s counts the bytes each operation must read and write once (its minimum traffic), not
what an implementation happens to move; "% peak" divides that by the device's memory
bandwidth (the datasheet figure of a known GPU; on a CPU, a measured tensor copy). On a
GPU the time is ``triton.testing.do_bench``'s; on a CPU the median wall time, and the
kernel column is the pure-torch reference (Triton kernels run on a CPU only through the
interpreter, which is for correctness, not speed).

    python bench/kernels.py [--sizes 1M,16M,128M] [--dtype float32] [--repeat N]
                            [--threads N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from autotune.kernels import (
    backend,
    dequantize_blockwise,
    layernorm_gelu,
    quantize_blockwise,
    scatter_add_decompress,
    topk_compress,
    topk_count,
)

RATIO = 0.01
RANKS = 4
BLOCK = 128
HIDDEN = 4096
# Datasheet HBM bandwidth, bytes/s, by a substring of torch.cuda.get_device_name().
GPU_PEAK_BANDWIDTH = {
    "H200": 4.8e12,
    "H100 SXM": 3.35e12,
    "H100 80GB HBM3": 3.35e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100 80GB PCIe": 1.935e12,
    "A100": 1.555e12,
}


@dataclass(frozen=True, slots=True)
class Row:
    kernel: str
    elements: int
    dtype: str
    backend: str
    bytes: int
    kernel_ms: float
    baseline: str
    baseline_ms: float


def parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text[:-1] if scale > 1 else text) * scale


def label(n: int) -> str:
    for suffix, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n % (1 << shift) == 0:
            return f"{n >> shift}{suffix}"
    return f"{n:,}"


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def timer(device: torch.device, repeat: int) -> Callable[[Callable[[], object]], float]:
    """Milliseconds per call: do_bench on a GPU, the median of ``repeat`` wall-clock runs
    after one warm-up elsewhere."""
    if device.type == "cuda":
        from triton.testing import do_bench

        def on_gpu(fn: Callable[[], object]) -> float:
            return float(do_bench(fn, warmup=25, rep=max(100, 10 * repeat)))

        return on_gpu

    def on_cpu(fn: Callable[[], object]) -> float:
        fn()
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    return on_cpu


def peak_bandwidth(device: torch.device) -> tuple[float | None, str]:
    """Bytes/s to divide by, and where the figure comes from."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, value in GPU_PEAK_BANDWIDTH.items():
            if key in name:
                return value, f"{name}: datasheet {value / 1e12:.2f} TB/s"
        return None, f"{name}: bandwidth unknown"
    src = torch.ones(64 << 20, dtype=torch.float32)  # 256 MiB
    dst = torch.empty_like(src)
    seconds = min(_timed(lambda: dst.copy_(src)) for _ in range(5))
    measured = 2 * src.numel() * 4 / seconds
    return measured, f"CPU: measured tensor copy {measured / 1e9:.1f} GB/s (read + write)"


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_topk(n: int, dtype: torch.dtype, device: torch.device, time_ms: Any) -> Row:
    grad = torch.randn(n, dtype=dtype, device=device)
    residual = 0.1 * torch.randn(n, dtype=dtype, device=device)
    k = topk_count(n, RATIO)

    def baseline() -> object:
        acc = grad + residual
        indices = torch.topk(acc.abs(), k, sorted=False).indices
        values = acc[indices]
        acc[indices] = 0
        residual.copy_(acc)
        return values, indices

    kernel_ms = time_ms(lambda: topk_compress(grad, residual, RATIO))
    used = backend()
    size = grad.element_size()
    moved = 3 * n * size + k * (size + 8)  # read grad, residual; write residual, values, idx
    return Row("topk_compress", n, str(dtype), used, moved, kernel_ms, "torch.topk",
               time_ms(baseline))  # fmt: skip


def bench_scatter(n: int, dtype: torch.dtype, device: torch.device, time_ms: Any) -> Row:
    k = RANKS * topk_count(n, RATIO)
    out = torch.zeros(n, dtype=dtype, device=device)
    values = torch.randn(k, dtype=dtype, device=device)
    indices = torch.randint(0, n, (k,), device=device)
    kernel_ms = time_ms(lambda: scatter_add_decompress(values, indices, out))
    used = backend()
    size = out.element_size()
    moved = k * (size + 8) + 2 * k * size  # values, indices; read-modify-write of out
    return Row("scatter_add_decompress", n, str(dtype), used, moved, kernel_ms,
               "index_add_", time_ms(lambda: out.index_add_(0, indices, values)))  # fmt: skip


def torch_quantize(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    tiles = x.view(-1, BLOCK).float()
    amax = tiles.abs().amax(dim=1)
    qmax = 127.0 if fmt == "int8" else 448.0
    scales = torch.where(amax > 0, amax / qmax, 1.0)
    y = tiles / scales[:, None]
    if fmt == "int8":
        return torch.round(y).clamp(-127, 127).to(torch.int8), scales
    return y.to(torch.float8_e4m3fn), scales


def bench_quantize(
    n: int, dtype: torch.dtype, device: torch.device, time_ms: Any, fmt: str
) -> list[Row]:
    x = torch.randn(n, dtype=dtype, device=device)
    kernel_ms = time_ms(lambda: quantize_blockwise(x, BLOCK, fmt))  # type: ignore[arg-type]
    used = backend()
    size = x.element_size()
    blocks = n // BLOCK
    moved = n * size + n + blocks * 8  # read x; write q, scales, non-finite counts
    rows = [Row(f"quantize {fmt}", n, str(dtype), used, moved, kernel_ms, "torch ops",
                time_ms(lambda: torch_quantize(x, fmt)))]  # fmt: skip
    q, scales, _ = quantize_blockwise(x, BLOCK, fmt)  # type: ignore[arg-type]

    def baseline() -> object:
        return (q.view(-1, BLOCK).float() * scales[:, None]).to(dtype)

    kernel_ms = time_ms(lambda: dequantize_blockwise(q, scales, BLOCK, dtype))
    used = backend()
    moved = n + blocks * 4 + n * size
    rows.append(Row(f"dequantize {fmt}", n, str(dtype), used, moved, kernel_ms, "torch ops",
                    time_ms(baseline)))  # fmt: skip
    return rows


def bench_layernorm_gelu(
    n: int, dtype: torch.dtype, device: torch.device, time_ms: Any
) -> list[Row]:
    x = torch.randn(n // HIDDEN, HIDDEN, dtype=dtype, device=device)
    weight = torch.ones(HIDDEN, dtype=dtype, device=device)
    bias = torch.zeros(HIDDEN, dtype=dtype, device=device)
    size = x.element_size()

    def unfused(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        normed = torch.nn.functional.layer_norm(a, (HIDDEN,), w, b, 1e-5)
        return torch.nn.functional.gelu(normed)

    with torch.no_grad():
        kernel_ms = time_ms(lambda: layernorm_gelu(x, weight, bias))
        used = backend()
        baseline_ms = time_ms(lambda: unfused(x, weight, bias))
    rows = [Row("layernorm_gelu fwd", n, str(dtype), used, 2 * n * size, kernel_ms,
                "F.layer_norm + F.gelu", baseline_ms)]  # fmt: skip
    xg = x.clone().requires_grad_()
    wg = weight.clone().requires_grad_()
    bg = bias.clone().requires_grad_()
    dout = torch.randn_like(x)

    def step(fn: Callable[..., torch.Tensor]) -> Callable[[], object]:
        def run() -> object:
            xg.grad = wg.grad = bg.grad = None
            fn(xg, wg, bg).backward(dout)
            return xg.grad

        return run

    kernel_ms = time_ms(step(layernorm_gelu))
    used = backend()
    # forward: read x, write out; backward: read dout, x; write dx
    rows.append(Row("layernorm_gelu fwd+bwd", n, str(dtype), used, 5 * n * size, kernel_ms,
                    "F.layer_norm + F.gelu", time_ms(step(unfused))))  # fmt: skip
    return rows


def table(rows: list[Row], peak: float | None) -> str:
    lines = [
        "| kernel | elements | backend | ms | GB/s | % peak | baseline | ms | GB/s | speed-up |",
        "|---|---:|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        gbs = r.bytes / r.kernel_ms / 1e6
        base_gbs = r.bytes / r.baseline_ms / 1e6
        share = f"{100 * gbs * 1e9 / peak:.0f}%" if peak else "n/a"
        lines.append(
            f"| {r.kernel} | {label(r.elements)} | {r.backend} | {r.kernel_ms:.3f} | "
            f"{gbs:.1f} | {share} | {r.baseline} | {r.baseline_ms:.3f} | {base_gbs:.1f} | "
            f"{r.baseline_ms / r.kernel_ms:.2f}x |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--sizes",
        help="comma-separated element counts, K/M/G suffixes (default 1M,16M,128M on a GPU; "
        "1M,16M on a CPU, where 128M takes minutes per kernel)",
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per measurement")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    default_sizes = "1M,16M,128M" if device.type == "cuda" else "1M,16M"
    sizes = [parse_size(s) for s in (args.sizes or default_sizes).split(",")]
    if backend(device) == "triton-interpreter":
        progress("warning: TRITON_INTERPRET=1: timing the interpreter, not a performance path")
    time_ms = timer(device, args.repeat)
    peak, peak_source = peak_bandwidth(device)
    rows: list[Row] = []
    for n in sizes:
        if n % HIDDEN:
            parser.error(f"sizes must be multiples of {HIDDEN} (rows of layernorm_gelu)")
        progress(f"{label(n)} elements: topk_compress")
        rows.append(bench_topk(n, dtype, device, time_ms))
        progress(f"{label(n)} elements: scatter_add_decompress")
        rows.append(bench_scatter(n, dtype, device, time_ms))
        for fmt in ("int8", "fp8_e4m3"):
            progress(f"{label(n)} elements: quantize/dequantize {fmt}")
            rows.extend(bench_quantize(n, dtype, device, time_ms, fmt))
        progress(f"{label(n)} elements: layernorm_gelu")
        rows.extend(bench_layernorm_gelu(n, dtype, device, time_ms))
    machine = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"{platform.machine()} CPU, {torch.get_num_threads()} threads"
    )
    print(f"{datetime.now(UTC).date()}, {machine}, torch {torch.__version__}, {args.dtype}")
    print(f"peak: {peak_source}")
    if device.type != "cuda":
        print("CPU: the kernel column is the pure-torch reference path (no GPU).")
    print(table(rows, peak))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "device": machine,
            "dtype": args.dtype,
            "peak_bytes_per_s": peak,
            "peak_source": peak_source,
            "rows": [asdict(r) for r in rows],
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
