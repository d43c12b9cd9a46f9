"""Steps to a target loss under each compression and precision setting, measured on real
training, against what the statistical efficiency predicts: the catalog's constants
(``autotune.perf.model.compression_efficiency`` x ``precision_efficiency``), and a
candidate from the fidelity the job measured in the first 10% of its run (cos^2 of its
compressed to its dense averaged gradient, ``autotune.executor.quality``).

    python bench/quality_validation.py [--task gpt-char:64] [--task mlp-synthetic]
        [--setting none --setting topk:0.01 ...] [--n-steps 150] [--seeds 0 1 2] [--dp 2]
        [--limit 3]

For each task and seed, plain fp32 DDP (``none``) trains ``--n-steps`` (N) steps; the
target is its loss at step N (the mean of the 10 steps up to N, as every loss here), and
the dense run's own steps to it are the first step whose 10-step mean is at or below it
(before N where the loss has flattened). Every setting trains up to 3N steps (``--limit``
N's) and reaches the target likewise (none within them: failed, its efficiency priced by
the progress it made, as ``autotune calibrate --efficiency`` prices it). A setting is
``COMPRESSION`` (``topk:0.01``, ``int8``, ``powersgd:4``) or ``precision=P`` (``bf16``,
``fp16``, ``fp8``: the whole map). Predicted steps: the dense run's / efficiency. Ranks run as local
processes over gloo (steps do not depend on the network). One JSON object on stdout and
in ``bench/out/quality_validation.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from autotune.benchmarks import REPO, publish
from autotune.core import CompressionSpec, JobConfig, Layout, PrecisionMap
from autotune.executor.efficiency import WINDOW, efficiency_of, reached, smoothed
from autotune.executor.local import run_local
from autotune.executor.worker import WorkerSpec
from autotune.perf.model import compression_efficiency, precision_efficiency

DEFAULT_SETTINGS = (
    "topk:0.1",
    "topk:0.01",
    "int8",
    "powersgd:4",
    "powersgd:1",
    "precision=bf16",
)


def _config(setting: str, dp: int) -> JobConfig:
    layout = Layout(dp=dp, world_size=dp)
    if setting.startswith("precision="):
        return JobConfig(layout=layout, precision=PrecisionMap.uniform(setting.split("=")[1]))  # type: ignore[arg-type]
    return JobConfig(layout=layout, compression=CompressionSpec.parse(setting))


def _train(task: str, batch: int | None, config: JobConfig, steps: int, seed: int) -> Any:
    spec = WorkerSpec(task=task, config=config, batch_size=batch, seed=seed)
    return run_local(spec, steps, save=False, timeout_s=3600.0)


def _first_fidelity(run: Any, until: int) -> float | None:
    cosines = [
        r.quality.cosine
        for r in run.reports[0][:until]
        if r.quality is not None and r.quality.cosine is not None
    ]
    return statistics.median(cosines) if cosines else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", action="append", help="TASK[:GLOBAL_BATCH] (repeatable)")
    parser.add_argument("--setting", action="append", help="repeatable; see above")
    parser.add_argument("--n-steps", type=int, default=150)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument(
        "--limit", type=int, default=3, help="each setting trains up to LIMIT x N steps"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "out" / "quality_validation.json"
    )
    args = parser.parse_args(argv)
    if args.n_steps < 2 * WINDOW:
        parser.error(f"--n-steps must be >= {2 * WINDOW}")
    if args.limit < 1:
        parser.error("--limit must be >= 1")
    n = args.n_steps
    rows = []
    for item in args.task or ["gpt-char:64", "mlp-synthetic"]:
        task, _, batch_text = item.partition(":")
        if task.endswith(".py"):  # path/to/file.py:Class[:batch]
            cls, _, batch_text = batch_text.partition(":")
            task = f"{task}:{cls}"
        batch = int(batch_text) if batch_text else None
        for seed in args.seeds:
            began = time.time()
            dense = smoothed(_train(task, batch, _config("none", args.dp), n, seed).losses())
            target = dense[n - 1]
            # Where the loss has flattened, the dense run itself gets there before N: the
            # reference is where it first did.
            base = reached(dense, target)
            assert base is not None
            for setting in args.setting or DEFAULT_SETTINGS:
                config = _config(setting, args.dp)
                run = _train(task, batch, config, args.limit * n, seed)
                # Steps to the target, and the efficiency as ``autotune calibrate
                # --efficiency`` prices it (an unreached target by the progress made).
                losses = smoothed(run.losses())
                measured = efficiency_of(setting, seed, dense[:n], losses)
                steps = measured.steps
                catalog = compression_efficiency(config.compression) * precision_efficiency(
                    config.precision
                )
                cosine = _first_fidelity(run, max(1, n // 10))
                by_cos2 = base / cosine**2 if cosine else None
                row = {
                    "task": task,
                    "seed": seed,
                    "setting": setting,
                    "target_loss": target,
                    "dense_steps": base,
                    "steps_measured": steps,
                    "steps_ratio": steps / base if steps else None,
                    "efficiency": measured.efficiency,
                    "predicted_catalog": base / catalog,
                    "catalog_error": (base / catalog) / steps - 1 if steps else None,
                    "first10_cosine": cosine,
                    "predicted_cos2": by_cos2,
                    "cos2_error": by_cos2 / steps - 1 if steps and by_cos2 else None,
                    "loss_at_3n": losses[-1],
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
            print(json.dumps({"task": task, "seed": seed, "seconds": time.time() - began}))
    publish(
        "quality_validation",
        args.out,
        {
            "n_steps": n,
            "dp": args.dp,
            "limit_steps": args.limit * n,
            "window": WINDOW,
            "rows": rows,
        },
    )
    return 0
