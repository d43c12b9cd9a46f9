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
bandwidth (the datasheet figure of a known GPU; on a CPU, a measured tensor copy), and
"% copy" by the bandwidth a torch copy (``dst.copy_(src)``, read + write) reaches on a
tensor of the same element count and dtype, timed the same way: what the memory system
delivers for that size in practice. On a GPU the time is ``triton.testing.do_bench``'s;
on a CPU the median wall time, and the kernel column is the pure-torch reference (Triton
kernels run on a CPU only through the interpreter, which is for correctness, not speed).

The issue's goals are checked at the largest size measured and reported (``goals`` in the
JSON, a list after the table): quantize and dequantize at >= 80 % of the copy's
bandwidth; topk_compress (ratio 0.01) >= 3x ``torch.topk``'s speed at >= 100M elements;
the fused LayerNorm+GELU faster than the two torch calls, forward and forward+backward.

    python bench/kernels.py [--sizes 1M,16M,100M] [--dtype float32] [--repeat N]
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
from dataclasses import asdict, dataclass, replace
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
    copy_bytes_per_s: float | None = None
    """What a torch copy of a tensor of ``elements`` elements of ``dtype`` reaches."""

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.kernel_ms * 1e3

    @property
    def of_copy(self) -> float | None:
        return self.bytes_per_s / self.copy_bytes_per_s if self.copy_bytes_per_s else None

    @property
    def speedup(self) -> float:
        return self.baseline_ms / self.kernel_ms


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


def copy_bandwidth(n: int, dtype: torch.dtype, device: torch.device, time_ms: Any) -> float:
    """Bytes/s of ``dst.copy_(src)`` on ``n`` elements of ``dtype`` (read + write)."""
    src = torch.randn(n, device=device).to(dtype)
    dst = torch.empty_like(src)
    ms = float(time_ms(lambda: dst.copy_(src)))
    return 2 * n * src.element_size() / ms * 1e3


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
            fn(xg, wg, bg).backward(dout)  # type: ignore[no-untyped-call]
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
        "| kernel | elements | backend | ms | GB/s | % peak | % copy | baseline | ms | GB/s "
        "| speed-up |",
        "|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        gbs = r.bytes_per_s / 1e9
        base_gbs = r.bytes / r.baseline_ms / 1e6
        share = f"{100 * r.bytes_per_s / peak:.0f}%" if peak else "n/a"
        of_copy = f"{100 * r.of_copy:.0f}%" if r.of_copy is not None else "n/a"
        lines.append(
            f"| {r.kernel} | {label(r.elements)} | {r.backend} | {r.kernel_ms:.3f} | "
            f"{gbs:.1f} | {share} | {of_copy} | {r.baseline} | {r.baseline_ms:.3f} | "
            f"{base_gbs:.1f} | {r.speedup:.2f}x |"
        )
    return "\n".join(lines)


TOPK_GOAL_ELEMENTS = 100_000_000


def goals(rows: list[Row], decides: bool = True) -> list[dict[str, Any]]:
    """The issue's targets, each checked at the largest size measured (smaller tensors
    are launch-bound). ``met`` is ``None`` where the measurement cannot decide: not on a
    GPU (``decides`` false: the reference path ran), no copy bandwidth, top-k measured
    below 100M elements."""
    if not rows:
        return []
    largest = max(r.elements for r in rows)
    out: list[dict[str, Any]] = []
    for r in rows:
        if r.elements != largest:
            continue
        if r.kernel.startswith(("quantize", "dequantize")):
            value = r.of_copy
            out.append(
                {
                    "goal": f"{r.kernel} >= 80% of a torch copy's bandwidth",
                    "kernel": r.kernel,
                    "elements": r.elements,
                    "measure": "fraction of copy bandwidth",
                    "value": value,
                    "target": 0.8,
                    "met": None if value is None else value >= 0.8,
                }
            )
        elif r.kernel == "topk_compress":
            out.append(
                {
                    "goal": "topk_compress >= 3x torch.topk at ratio 0.01 on 100M elements",
                    "kernel": r.kernel,
                    "elements": r.elements,
                    "measure": "speed-up over torch.topk",
                    "value": r.speedup,
                    "target": 3.0,
                    "met": r.speedup >= 3.0 if r.elements >= TOPK_GOAL_ELEMENTS else None,
                }
            )
        elif r.kernel.startswith("layernorm_gelu"):
            out.append(
                {
                    "goal": f"{r.kernel} faster than F.layer_norm + F.gelu",
                    "kernel": r.kernel,
                    "elements": r.elements,
                    "measure": "speed-up over the torch pair",
                    "value": r.speedup,
                    "target": 1.0,
                    "met": r.speedup > 1.0,
                }
            )
    if not decides:
        out = [{**g, "met": None} for g in out]
    return out


def goal_lines(checked: list[dict[str, Any]]) -> str:
    verdict = {True: "met", False: "NOT met", None: "undecided"}
    return "\n".join(
        f"- {g['goal']} ({label(g['elements'])}): "
        + (f"{g['value']:.2f}" if g["value"] is not None else "n/a")
        + f" (target {g['target']}): {verdict[g['met']]}"
        for g in checked
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--sizes",
        help="comma-separated element counts, K/M/G suffixes (default 1M,16M,100M on a GPU; "
        "1M,16M on a CPU, where 100M takes minutes per kernel)",
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
    default_sizes = "1M,16M,100M" if device.type == "cuda" else "1M,16M"
    sizes = [parse_size(s) for s in (args.sizes or default_sizes).split(",")]
    interpreted = backend(device) == "triton-interpreter"
    if interpreted:
        progress("warning: TRITON_INTERPRET=1: timing the interpreter, not a performance path")
    time_ms = timer(device, args.repeat)
    peak, peak_source = peak_bandwidth(device)
    for n in sizes:
        if n % HIDDEN:
            parser.error(f"sizes must be multiples of {HIDDEN} (rows of layernorm_gelu)")
    machine = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"{platform.machine()} CPU, {torch.get_num_threads()} threads"
    )
    decides = device.type == "cuda" and not interpreted
    rows: list[Row] = []
    errors: list[dict[str, Any]] = []

    def write_json() -> None:
        if not args.json:
            return
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "device": machine,
            "dtype": args.dtype,
            "sizes": sizes,
            "peak_bytes_per_s": peak,
            "peak_source": peak_source,
            "torch": torch.__version__,
            "rows": [
                {
                    **asdict(r),
                    "bytes_per_s": r.bytes_per_s,
                    "of_copy": r.of_copy,
                    "speedup": r.speedup,
                }
                for r in rows
            ],
            "goals": goals(rows, decides=decides),
            "errors": errors,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")

    benches: list[tuple[str, Callable[[int], Row | list[Row]]]] = [
        ("topk_compress", lambda n: bench_topk(n, dtype, device, time_ms)),
        ("scatter_add_decompress", lambda n: bench_scatter(n, dtype, device, time_ms)),
        ("quantize/dequantize int8", lambda n: bench_quantize(n, dtype, device, time_ms, "int8")),
        (
            "quantize/dequantize fp8_e4m3",
            lambda n: bench_quantize(n, dtype, device, time_ms, "fp8_e4m3"),
        ),
        ("layernorm_gelu", lambda n: bench_layernorm_gelu(n, dtype, device, time_ms)),
    ]
    for n in sizes:
        first = len(rows)
        progress(f"{label(n)} elements: torch copy")
        copy = copy_bandwidth(n, dtype, device, time_ms)
        for name, bench in benches:
            progress(f"{label(n)} elements: {name}")
            try:
                made = bench(n)
            except Exception as exc:  # one kernel failing does not end the benchmark
                errors.append({"kernel": name, "elements": n, "error": repr(exc)})
                progress(f"{label(n)} elements: {name} FAILED: {exc!r}")
                continue
            rows.extend(made if isinstance(made, list) else [made])
        rows[first:] = [replace(r, copy_bytes_per_s=copy) for r in rows[first:]]
        write_json()  # after each size: a run cut short keeps what it measured
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(f"{datetime.now(UTC).date()}, {machine}, torch {torch.__version__}, {args.dtype}")
    print(f"peak: {peak_source}")
    if device.type != "cuda":
        print("CPU: the kernel column is the pure-torch reference path (no GPU).")
    print(table(rows, peak))
    print("\ngoals (at the largest size):")
    print(goal_lines(goals(rows, decides=decides)))
    for error in errors:
        print(f"FAILED: {error['kernel']} at {label(error['elements'])}: {error['error']}")
    write_json()
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
