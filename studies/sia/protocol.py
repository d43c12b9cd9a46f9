"""The learned policy against Sia in the Sia-compatible world, every workload held out of
the training, the teacher's choice and the selection that play it
(``bench/sia_learned.py`` runs it).

Two folds (``FOLDS``): each trains on half of the ten Helios ("saturn") workloads and is
tested on the other half and on half of the eight Philly workloads, so every one of
the 18 is played by a policy that never saw it, and no fold reads Sia's "newTrace"
(on which the goodput optimiser's p was chosen). Per fold:

- **The teacher**: ``SiaGoodputPolicy``'s size exponent among ``EXPONENTS`` by its mean
  average JCT on the fold's training workloads (cached in ``OUT/teacher-grid.json``).
- **Training** (``autotune.policies.ppo.train_ppo``, the ``sia-compat`` world): a
  residual policy whose action corrects the teacher's weights (zero is the teacher),
  each job reading a pooled summary of all jobs; imitation of the teacher first
  (critic included), then PPO on the average-JCT reward.
- **Selection**: between the imitation, the checkpoints every ``checkpoint_every``
  iterations and the last, by mean average JCT on the training workloads only.
- **Test**: every candidate and the teacher play each held-out workload; the chosen one
  is the fold's result. Each run keeps every job's JCT, so ``table`` can set the
  learned policy and the teacher against Sia's own runs job by job (its ``--output``
  logs, ``sia_jcts``).

A fold is written to ``OUT/fold-NAME-seed-S.json`` when it ends (a rerun skips it).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from autotune.policies.ppo import train_ppo
from autotune.policies.ppo_settings import PPOSettings, TraceSource
from autotune.policies.serving import PolicyServer
from autotune.studies.pollux.protocol import checkpoints, paired_difference, pooled_difference
from autotune.studies.sia.fidelity import PHILLY, SATURN, play, sia_jcts
from autotune.studies.sia.goodput import SiaGoodputPolicy
from autotune.studies.sia.learned import QUANTUM, SiaLearnedPolicy

__all__ = [
    "EXPONENTS",
    "FOLDS",
    "SLOTS",
    "fold",
    "learned",
    "table",
    "teacher",
]

FOLDS: Final = {
    "a": (SATURN[:5], SATURN[5:] + PHILLY[:4]),
    "b": (SATURN[5:], SATURN[:5] + PHILLY[4:]),
}
"""Fold name -> (training workloads, held-out workloads), as named under Sia's
``workloads`` folder."""
EXPONENTS: Final = (0.0, 0.5, 1.0)
"""The teacher's size exponents (0: every job weighs 1, the optimiser of
``autotune sia eval --policy goodput``)."""
SLOTS: Final = 32
MAX_STEPS: Final = 5000


def _run(sia: Path, name: str, make: Any) -> dict[str, Any]:
    """One play of workload ``name`` (its average JCT in hours, every job's JCT)."""
    result = play(sia / "workloads" / name, sia, policy=make)
    return {k: result[k] for k in ("avg_jct_h", "finished", "jobs", "restarts", "jcts_s", "wall_s")}


def learned(sia: Path, name: str, checkpoint: Path) -> dict[str, Any]:
    """One play of workload ``name`` under the learned policy at ``checkpoint``."""
    server = PolicyServer(checkpoint, slots=SLOTS, continuous=True)
    return _run(sia, name, lambda env: SiaLearnedPolicy(env, server))


def _teacher_run(sia: Path, name: str, exponent: float) -> dict[str, Any]:
    return _run(sia, name, lambda env: SiaGoodputPolicy(env, exponent=exponent))


def teacher(sia: Path, train: Sequence[str], out: Path, name: str) -> dict[str, Any]:
    """The teacher's exponent for fold ``name``: the lowest mean average JCT over
    ``train`` (each exponent's plays cached in ``OUT/teacher-grid-NAME.json``, one file
    per fold, as folds run side by side)."""
    path = out / f"teacher-grid-{name}.json"
    grid: dict[str, dict[str, float]] = json.loads(path.read_text()) if path.exists() else {}
    for exponent in EXPONENTS:
        runs = grid.setdefault(str(exponent), {})
        for name in train:
            if name not in runs:
                runs[name] = _teacher_run(sia, name, exponent)["avg_jct_h"]
                path.write_text(json.dumps(grid, indent=1) + "\n")
    means = {e: float(np.mean([grid[str(e)][n] for n in train])) for e in EXPONENTS}
    best = min(means, key=means.__getitem__)
    return {"exponent": best, "training_means_h": {str(e): m for e, m in means.items()}}


def fold(
    sia: Path,
    name: str,
    seed: int,
    out: Path,
    *,
    iterations: int,
    train_batch: int,
    checkpoint_every: int | None = None,
    quantum: float = QUANTUM,
    folds: Mapping[str, tuple[Sequence[str], Sequence[str]]] = FOLDS,
) -> dict[str, Any]:
    """Train fold ``name`` (``FOLDS``) at ``seed``, select on its training workloads,
    test on its held-out ones; the result is also written to ``OUT``. ``quantum``: the
    step the policy's corrections are rounded to (``SiaCompatEnv``)."""
    path = out / f"fold-{name}-seed-{seed}.json"
    if path.exists():
        done: dict[str, Any] = json.loads(path.read_text())
        ran = (done["training"]["ppo_iterations"], done.get("quantum"))
        if ran != (iterations, quantum):
            raise ValueError(
                f"{path} holds a run of {ran[0]} iterations at quantum {ran[1]}, not "
                f"{iterations} at {quantum}: give another output folder"
            )
        return done
    train, test = folds[name]
    began = time.perf_counter()
    chosen_teacher = teacher(sia, train, out, name)
    exponent = chosen_teacher["exponent"]
    settings = PPOSettings(
        iterations=iterations,
        slots=SLOTS,
        round_s=60.0,
        max_steps=MAX_STEPS,
        train_batch=train_batch,
        minibatch=256,
        gamma=0.99,
        warm_start="sia-goodput",
        warm_start_episodes=len(train),
        warm_start_epochs=60,
        checkpoint_every=checkpoint_every or 10**6,
        seed=seed,
        sources=tuple(
            TraceSource(jobs=str(sia / "workloads" / w), kind="sia-compat", traces=str(sia))
            for w in train
        ),
        world_options={"size_exponent": exponent, "residual": 1.0, "quantum": quantum},
        pooled=True,
    )
    folder = out / f"fold-{name}-seed-{seed}"
    # A run that stopped before its result leaves checkpoints selection must not see.
    shutil.rmtree(folder, ignore_errors=True)
    report = train_ppo(settings, folder)
    candidates = checkpoints(folder, report)
    selection: dict[str, dict[str, float]] = {}
    for label, checkpoint in candidates.items():
        runs = {w: learned(sia, w, checkpoint)["avg_jct_h"] for w in train}
        selection[label] = {**runs, "mean": float(np.mean(list(runs.values())))}
        print(f"  fold {name}: {label}, training workloads {selection[label]['mean']:.4f} h")
    chosen = min(selection, key=lambda n: selection[n]["mean"])
    tested: dict[str, dict[str, Any]] = {}
    for w in test:
        tested[w] = {label: learned(sia, w, cp) for label, cp in candidates.items()}
        tested[w]["teacher"] = _teacher_run(sia, w, exponent)
        print(
            f"  fold {name}: {w}: {chosen} {tested[w][chosen]['avg_jct_h']:.4f} h, "
            f"teacher {tested[w]['teacher']['avg_jct_h']:.4f} h",
            flush=True,
        )
    last = report["history"][-1] if report["history"] else {}
    result = {
        "fold": name,
        "seed": seed,
        "train": list(train),
        "test": list(test),
        "teacher": chosen_teacher,
        "quantum": quantum,
        "chosen": chosen,
        "selection": selection,
        "tested": tested,
        "training": {
            "imitation_samples": report.get("warm_start", {}).get("samples"),
            "ppo_iterations": iterations,
            "ppo_env_steps": last.get("env_steps"),
            "train_s": round(report["time_s"], 1),
            "wall_s": round(time.perf_counter() - began, 1),
        },
    }
    path.write_text(json.dumps(result) + "\n")
    return result


def table(out: Path, sia_runs: Path) -> str:
    """The Markdown table of the folds in ``out`` against Sia's runs (``sia_runs``: its
    logs as ``<set>/<workload>.log``, e.g. ``saturn/workload-1.log``): per held-out
    workload, Sia's, the teacher's and the learned policy's average JCT, and the per-job
    paired differences; pooled per workload set."""
    rows: list[tuple[str, str, dict[str, Any], dict[str, float]]] = []
    for fold_file in sorted(out.glob("fold-*-seed-*.json")):
        result = json.loads(fold_file.read_text())
        for w, runs in result["tested"].items():
            log = sia_runs / Path(w).with_suffix(".log")
            if log.is_file():
                played = {**runs, "learned": runs[result["chosen"]]}
                rows.append((result["fold"], w, played, sia_jcts(log)))
    lines = [
        "| workload | fold | Sia (h) | teacher (h) | learned (h) | learned vs Sia, per job "
        "| learned vs teacher, per job |",
        "|---|---|---|---|---|---|---|",
    ]
    for fold_name, w, runs, theirs in sorted(rows, key=lambda r: _order(r[1])):
        sia_h = float(np.mean(list(theirs.values()))) / 3600
        vs_sia = paired_difference(runs["learned"]["jcts_s"], theirs)
        vs_teacher = paired_difference(runs["learned"]["jcts_s"], runs["teacher"]["jcts_s"])
        lines.append(
            f"| {w} | {fold_name} | {sia_h:.3f} | {runs['teacher']['avg_jct_h']:.3f} | "
            f"{runs['learned']['avg_jct_h']:.3f} | {_interval(vs_sia)} | {_interval(vs_teacher)} |"
        )
    for group in ("saturn", "philly"):
        chosen = [r for r in rows if r[1].startswith(group)]
        if not chosen:
            continue
        for who in ("learned", "teacher"):
            pairs = [(r[2][who]["jcts_s"], r[3]) for r in chosen]
            below = sum(
                1 for r in chosen if r[2][who]["avg_jct_h"] * 3600 < np.mean(list(r[3].values()))
            )
            lines.append(
                f"| **{group}, {who} vs Sia** | | | | | {_interval(pooled_difference(pairs))}, "
                f"below on {below} of {len(chosen)} | |"
            )
        pairs = [(r[2]["learned"]["jcts_s"], r[2]["teacher"]["jcts_s"]) for r in chosen]
        lines.append(
            f"| **{group}, learned vs teacher** | | | | | | {_interval(pooled_difference(pairs))} |"
        )
    return "\n".join(lines)


def _order(name: str) -> tuple[str, int]:
    group, _, stem = name.partition("/")
    return group, int(stem.removeprefix("workload-").removesuffix(".csv"))


def _interval(found: tuple[float, float, float]) -> str:
    mean, low, high = found
    return f"{mean:+.1%} [{low:+.1%}, {high:+.1%}]"
