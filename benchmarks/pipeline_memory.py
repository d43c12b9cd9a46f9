"""Memory a pipeline-parallel rank holds, for pp 1, 2 and 4, on a GPT of 8+ blocks.

    python bench/pipeline_memory.py [--layers 8] [--width 256] [--pps 1,2,4]
        [--mode ranks|stages] [--device cpu|cuda] [--init full|module|both]
        [--steps 2] [--seed 0] [--out bench/out/pipeline_memory.json]

``--mode ranks`` (default) trains the job for ``--steps`` steps with every rank a
``RankWorker`` in its own process over gloo (``autotune.executor.local``, no Ray) and
reports, per rank: the bytes of parameters it holds (local storage; other stages'
parameters are on ``meta``), the whole model's, and its peak resident set after setup
and after the steps, also above the resident set of a process that has only imported
the executor (``baseline_rss_bytes``).

``--mode stages`` builds each stage alone (``build_stage``) on ``--device``, gives it
gradients and AdamW moments (one optimizer step), and reports the bytes of parameters
and, on a GPU, ``torch.cuda.max_memory_allocated``: the training state a rank holds,
without activations. This runs on one GPU, where NCCL cannot put several ranks.

``--init``: how stages get their initial weights (``build_stage``): ``full`` builds the
whole model on CPU once per rank and keeps the stage's part (bit-identical to one rank;
host memory holds the whole model for a moment), ``module`` initialises each module
alone (what happens above ``AUTOTUNE_FULL_INIT_MAX_BYTES``: no rank ever holds more
than its stage). Goals: pp=2 <= 0.6x and pp=4 <= 0.35x pp=1's parameter bytes per rank
(the largest rank). The JSON gives every number and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

CONFIG_ENV = "PIPELINE_MEMORY_GPT"
HERE = Path(__file__).resolve()


class BenchGPT:
    """gpt-char's task with the shape in ``$PIPELINE_MEMORY_GPT`` (JSON of GPTConfig's
    fields): the ranks load it by this file's path."""

    def __new__(cls) -> Any:  # a GPTChar, built in the rank's process
        from autotune.catalog.tasks import GPTConfig
        from autotune.executor.tasks import GPTChar

        fields = json.loads(os.environ.get(CONFIG_ENV, "{}"))
        return GPTChar(config=GPTConfig(**fields))


def _rss() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _baseline(queue: Any) -> None:
    """The peak resident set of a process that imports the executor and loads the task."""
    import autotune.executor.worker  # noqa: F401
    from autotune.executor.tasks import load_task

    load_task(f"{HERE}:BenchGPT")
    queue.put(_rss())


def _stage(queue: Any, pp: int, stage: int, device: str, seed: int) -> None:
    """Build one stage alone on ``device``, with gradients and AdamW moments."""
    from autotune.executor.stage_build import build_stage, parameter_bytes
    from autotune.executor.stage_plan import derive_split_points
    from autotune.executor.tasks import load_task

    task = load_task(f"{HERE}:BenchGPT")
    inputs, _ = next(task.batches(0, 1, seed))
    if device == "cuda":
        torch.cuda.set_device(0)
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    built = build_stage(
        task.build_model,
        seed=seed,
        stages=pp,
        stage=stage,
        split_points=lambda m: derive_split_points(m, pp),
        example=inputs,
        device=device,
    )
    build_s = time.perf_counter() - started
    params = [p for p in built.model.parameters() if not p.is_meta]
    after_build = torch.cuda.max_memory_allocated() if device == "cuda" else _rss()
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    optimizer.step()
    if device == "cuda":
        torch.cuda.synchronize()
    queue.put(
        {
            "stage": stage,
            "parameter_bytes": parameter_bytes(built.model),
            "model_parameter_bytes": built.model_bytes,
            "sources": built.sources,
            "build_s": round(build_s, 3),
            "peak_after_build_bytes": int(after_build),
            "peak_with_grads_and_adam_bytes": int(
                torch.cuda.max_memory_allocated() if device == "cuda" else _rss()
            ),
            "peak_kind": "cuda_max_memory_allocated" if device == "cuda" else "ru_maxrss",
        }
    )


def _spawn(target: Any, *args: Any) -> Any:
    context = torch.multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=target, args=(queue, *args))
    process.start()
    result = queue.get(timeout=1800)
    process.join()
    return result


def _ranks(pp: int, steps: int, seed: int) -> dict[str, Any]:
    from autotune.core import JobConfig, Layout
    from autotune.executor.local import run_local
    from autotune.executor.worker import WorkerSpec

    spec = WorkerSpec(
        task=f"{HERE}:BenchGPT",
        config=JobConfig(
            layout=Layout(world_size=pp, dp=1, pp=pp, micro_batches=2 if pp > 1 else 1)
        ),
        seed=seed,
    )
    started = time.perf_counter()
    run = run_local(spec, steps, save=False, timeout_s=3600)
    return {
        "wall_s": round(time.perf_counter() - started, 2),
        "losses": run.losses(),
        "ranks": [
            {
                "stage": after["stage"],
                "parameter_bytes": after["parameter_bytes"],
                "model_parameter_bytes": after["model_parameter_bytes"],
                "sources": after["sources"],
                "peak_rss_after_setup_bytes": setup["peak_memory_bytes"],
                "peak_rss_after_steps_bytes": after["peak_memory_bytes"],
            }
            for setup, after in zip(run.memory_after_setup, run.memory, strict=True)
        ],
    }


def _ratios(per_pp: dict[int, dict[str, Any]], key: str, rows: str) -> dict[str, float]:
    if 1 not in per_pp:
        return {}
    base = max(r[key] for r in per_pp[1][rows])
    return {
        f"pp{pp}": round(max(r[key] for r in out[rows]) / base, 4)
        for pp, out in per_pp.items()
        if base
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--pps", default="1,2,4", help="pipeline degrees, comma-separated")
    parser.add_argument("--mode", choices=("ranks", "stages"), default="ranks")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--init", choices=("full", "module", "both"), default="both")
    parser.add_argument("--steps", type=int, default=2, help="training steps (--mode ranks)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE.parent / "out" / "pipeline_memory.json")
    args = parser.parse_args(argv)
    if args.mode == "ranks" and args.device != "cpu":
        parser.error("--mode ranks runs the ranks over gloo on CPU; use --mode stages on a GPU")
    torch.manual_seed(args.seed)
    shape = {
        "layers": args.layers,
        "width": args.width,
        "heads": args.heads,
        "context": args.context,
        "batch_size": args.batch_size,
    }
    os.environ[CONFIG_ENV] = json.dumps(shape)
    pps = [int(p) for p in args.pps.split(",")]
    inits = ("full", "module") if args.init == "both" else (args.init,)
    report: dict[str, Any] = {
        "config": {**shape, "pps": pps, "mode": args.mode, "device": args.device},
        "seed": args.seed,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "goals": {"pp2": 0.6, "pp4": 0.35},
        "results": {},
    }
    if args.mode == "ranks":
        report["baseline_rss_bytes"] = _spawn(_baseline)
    for init in inits:
        # Above the limit, each module is initialised alone (no whole-model build).
        os.environ["AUTOTUNE_FULL_INIT_MAX_BYTES"] = str(8 << 30 if init == "full" else 0)
        per_pp: dict[int, dict[str, Any]] = {}
        for pp in pps:
            if args.mode == "ranks":
                per_pp[pp] = _ranks(pp, args.steps, args.seed)
            else:
                per_pp[pp] = {
                    "ranks": [_spawn(_stage, pp, s, args.device, args.seed) for s in range(pp)]
                }
            print(f"init={init} pp={pp}: {json.dumps(per_pp[pp]['ranks'])}", file=sys.stderr)
        peak_key = (
            "peak_rss_after_steps_bytes"
            if args.mode == "ranks"
            else "peak_with_grads_and_adam_bytes"
        )
        entry: dict[str, Any] = {
            "per_pp": {str(pp): out for pp, out in per_pp.items()},
            "parameter_bytes_ratio": _ratios(per_pp, "parameter_bytes", "ranks"),
            "peak_ratio": _ratios(per_pp, peak_key, "ranks"),
        }
        if args.mode == "ranks":
            base = report["baseline_rss_bytes"]
            above = {
                pp: {"ranks": [{"x": r[peak_key] - base} for r in out["ranks"]]}
                for pp, out in per_pp.items()
            }
            entry["peak_rss_above_baseline_ratio"] = _ratios(above, "x", "ranks")
        report["results"][init] = entry
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    summary = {init: r["parameter_bytes_ratio"] for init, r in report["results"].items()}
    print(json.dumps({"out": str(args.out), "parameter_bytes_ratio": summary}))


if __name__ == "__main__":
    main()
