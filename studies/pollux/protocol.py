"""The learned policy against Pollux in the Pollux-compatible world, each workload held
out of its own training (``bench/pollux_learned.py`` runs it).

For every held-out workload W: choose ``goodput-size``'s exponent and the allocation's
fairness p (the teacher's two hyperparameters) among ``EXPONENTS`` x ``FAIRNESS`` by
their mean average JCT on the other seven workloads. For every training seed S: train
the learned policy (``autotune.policies.ppo.train_ppo``) on the other seven workloads in the
Pollux-compatible mode (imitation of ``goodput-size``, then PPO on the average-JCT
reward), pick between the imitation and the PPO checkpoint by their mean average JCT
on those seven training workloads (never on W), and play W with it. The baselines
(Tiresias, rules, the oracle, ``goodput``, ``goodput-size``, static) play W in the same
mode. Every run reports the average JCT with a 95% bootstrap interval over the
workload's jobs, every job's JCT, and per application the jobs' average wait before
their first start, their GPUs while running and their JCT (where a policy loses time,
and to which jobs). Pollux's own per-job JCTs (``data/pollux_jcts.json``, from the
artifact's ``results-jobload/pollux-1.0/summary.json``) set every policy against Pollux
job by job: the mean difference on the same 160 jobs, with a paired bootstrap interval,
which says far more than two averages' overlapping intervals over jobs.

Each fold is written to ``OUT/fold-W-seed-S.json`` as it ends (a rerun skips folds
already there) and the baselines to ``OUT/baselines-W.json``; ``table`` gives the
Markdown table of whatever is in ``OUT``.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Final

import numpy as np

from autotune.policies.evaluate import run_episode
from autotune.policies.ppo import train_ppo
from autotune.policies.ppo_settings import PPOSettings, TraceSource
from autotune.policies.serving import PolicyServer
from autotune.stats import mean_t_interval, percentile_interval
from autotune.studies.pollux.env import compat_env
from autotune.studies.pollux.evaluate import POLICIES
from autotune.studies.pollux.goodput import SizedGoodputPolicy
from autotune.studies.pollux.learned import PolluxLearnedPolicy
from autotune.studies.pollux.trace import trace_of

__all__ = [
    "BASELINES",
    "POLLUX",
    "POLLUX_OPTIMUS",
    "POLLUX_TIRESIAS",
    "baselines",
    "checkpoints",
    "fold",
    "learned",
    "paired_difference",
    "play",
    "pollux_jcts",
    "pooled_difference",
    "table",
    "teacher",
    "teacher_grid",
    "workloads",
]


def workloads(text: str) -> list[int]:
    """Workload numbers from ``1-8``, ``6`` or ``1,3-5``."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


# Average JCT (s) in the artifact's results-jobload/{tiresias,pollux,optimus}-1.0/summary.json.
POLLUX_TIRESIAS: Final = {1: 2474, 2: 5145, 3: 3876, 4: 3280, 5: 3501, 6: 3470, 7: 5480, 8: 5080}
POLLUX: Final = {1: 2089, 2: 3323, 3: 2188, 4: 2721, 5: 2674, 6: 2446, 7: 3616, 8: 2952}
"""Pollux's published average JCT (s) of each workload."""
POLLUX_OPTIMUS: Final = {1: 4087, 2: 6914, 3: 3944, 4: 5968, 5: 5656, 6: 5302, 7: 7291, 8: 6294}
POLLUX_JCTS: Final = Path(__file__).resolve().parent / "data" / "pollux_jcts.json"
"""Pollux's own per-job JCTs on the eight workloads (the artifact's
``results-jobload/pollux-1.0/summary.json``, Apache-2.0): the same 160 jobs, so a
policy's average JCT can be set against Pollux's job by job."""
BASELINES = ("tiresias", "rules", "oracle", "goodput", "goodput-size", "static")
EXPONENTS = (0.0, 0.5, 1.0)
"""``goodput-size``'s exponents the teacher is chosen from (0: plain ``goodput``)..."""
FAIRNESS = (-1.0, -0.5, -0.25)
"""... and the allocation's p (Pollux's default -1; nearer 0 is less fair, more
throughput)."""
SLOTS = 32
MAX_STEPS = 1_000_000


def _source(pollux: Path, workload: int) -> TraceSource:
    return TraceSource(
        jobs=str(pollux / "workloads" / f"workload-{workload}.csv"),
        kind="pollux-compat",
        traces=str(pollux / "traces"),
    )


def play(pollux: Path, workload: int, make: Any) -> dict[str, Any]:
    """One run of ``workload``; ``make(env)`` builds the policy for the world's
    environment (the learned one encodes its observations itself, with the demand
    forecaster it was trained with)."""
    env = compat_env(
        pollux / "workloads" / f"workload-{workload}.csv",
        pollux / "traces",
        slots=SLOTS,
        max_steps=MAX_STEPS,
    )
    began = time.perf_counter()
    result: dict[str, Any] = run_episode(make(env), env, seed=0)
    assert env.sim is not None
    jobs = sorted(env.sim.jobs.values(), key=lambda j: j.status.spec.submitted_at)
    result["jct_by_job"] = {
        j.job_id: j.status.finished_s - j.status.spec.submitted_at
        for j in jobs
        if j.status.finished_s is not None
    }
    jct = np.array(list(result["jct_by_job"].values()))
    draws = np.random.default_rng(0).choice(jct, size=(2000, jct.size)).mean(axis=1)
    result["avg_jct_ci95"] = list(percentile_interval(draws, 0.95))
    per_app: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for j in jobs:
        status = j.status
        if status.finished_s is None or status.started_s is None:
            continue
        trace = trace_of(j.arrival)
        app = trace.name if trace is not None else "?"
        running = max(status.finished_s - status.started_s, 1e-9)
        per_app[app]["jct_s"].append(status.finished_s - status.spec.submitted_at)
        per_app[app]["wait_s"].append(status.started_s - status.spec.submitted_at)
        per_app[app]["gpus"].append(j.attained_gpu_s / running)
    result["per_app"] = {
        app: {"jobs": len(v["jct_s"]), **{k: float(np.mean(x)) for k, x in v.items()}}
        for app, v in sorted(per_app.items())
    }
    result["restarts"] = sum(j.restarts for j in jobs)
    result["wall_s"] = round(time.perf_counter() - began, 2)
    return result


def learned(pollux: Path, workload: int, checkpoint: Path) -> dict[str, Any]:
    """One run of ``workload`` under the learned policy at ``checkpoint``."""
    server = PolicyServer(checkpoint, slots=SLOTS, continuous=True)
    return play(pollux, workload, lambda env: PolluxLearnedPolicy(env.cluster, server))


def teacher_grid(pollux: Path, out: Path) -> dict[str, dict[str, float]]:
    """``goodput-size``'s average JCT on every workload for every (exponent, p) of the
    grid, ``"exponent,p" -> {workload: s}`` (cached in ``OUT/teacher-grid.json``)."""
    path = out / "teacher-grid.json"
    grid: dict[str, dict[str, float]] = json.loads(path.read_text()) if path.exists() else {}
    for exponent in EXPONENTS:
        for p in FAIRNESS:
            key = f"{exponent},{p}"
            if key in grid:
                continue
            grid[key] = {
                str(w): play(
                    pollux,
                    w,
                    lambda env, e=exponent, f=p: SizedGoodputPolicy(env.cluster, exponent=e, p=f),
                )["avg_jct_s"]
                for w in range(1, 9)
            }
            print(f"  goodput-size exponent {exponent}, p {p}: {grid[key]}", flush=True)
            path.write_text(json.dumps(grid, indent=1) + "\n")
    return grid


def teacher(pollux: Path, held_out: int, out: Path) -> dict[str, Any]:
    """The teacher's (exponent, p) for the fold of ``held_out``: the lowest mean average
    JCT over the other seven workloads."""
    grid = teacher_grid(pollux, out)
    train = [str(w) for w in range(1, 9) if w != held_out]
    means = {key: float(np.mean([runs[w] for w in train])) for key, runs in grid.items()}
    best = min(means, key=means.__getitem__)
    exponent, p = (float(x) for x in best.split(","))
    return {"held_out": held_out, "training_means": means, "exponent": exponent, "p": p}


def fold(
    pollux: Path,
    held_out: int,
    seed: int,
    out: Path,
    *,
    iterations: int,
    train_batch: int,
    exponent: float,
    p: float,
    residual: bool = False,
    pooled: bool = False,
    env_runners: int = 0,
    checkpoint_every: int | None = None,
    imitate: bool = True,
) -> dict[str, Any]:
    """Train without ``held_out``, select on the training workloads, test on it.
    ``residual``: the policy corrects its teacher's weights (zero correction is the
    teacher) instead of setting them; ``pooled``: each job's policy reads a summary of
    all jobs (``PPOSettings.pooled``); ``env_runners``: sampling processes;
    ``checkpoint_every``: iterations between the checkpoints that selection weighs
    beside the imitation and the last (``None``: those two only); ``imitate``: False
    trains from scratch (no imitation of the teacher first, and no imitation-only
    checkpoint to select)."""
    train = [w for w in range(1, 9) if w != held_out]
    settings = PPOSettings(
        iterations=iterations,
        slots=SLOTS,
        round_s=60.0,
        max_steps=5000,
        train_batch=train_batch,
        minibatch=256,
        gamma=0.99,
        warm_start="goodput-size" if imitate else None,
        warm_start_episodes=len(train),
        warm_start_epochs=60,
        checkpoint_every=checkpoint_every or 10**6,
        seed=seed,
        sources=tuple(_source(pollux, w) for w in train),
        world_options={"size_exponent": exponent, "fairness_p": p, "residual": float(residual)},
        pooled=pooled,
        env_runners=env_runners,
    )
    folder = out / f"fold-{held_out}-seed-{seed}"
    report = train_ppo(settings, folder)
    candidates = checkpoints(folder, report, imitate=imitate)
    selection: dict[str, dict[str, float]] = {}
    for name, path in candidates.items():
        runs = {w: learned(pollux, w, path)["avg_jct_s"] for w in train}
        mean = float(np.mean(list(runs.values())))
        selection[name] = {**{str(w): v for w, v in runs.items()}, "mean": mean}
        print(f"  fold {held_out} seed {seed}: {name}, training workloads {mean:.0f} s", flush=True)
    chosen = min(selection, key=lambda n: selection[n]["mean"])
    tested = {name: learned(pollux, held_out, path) for name, path in candidates.items()}
    last = report["history"][-1] if report["history"] else {}
    return {
        "held_out": held_out,
        "seed": seed,
        "train_workloads": train,
        "teacher_exponent": exponent,
        "fairness_p": p,
        "residual": residual,
        "pooled": pooled,
        "imitate": imitate,
        "chosen": chosen,
        "learned": tested[chosen],
        "candidates": tested,
        "selection": selection,
        "training": {
            "imitation_samples": report.get("warm_start", {}).get("samples"),
            "imitation_loss": report.get("warm_start", {}).get("loss"),
            "ppo_iterations": iterations,
            "ppo_env_steps": last.get("env_steps"),
            "wall_s": round(report["time_s"], 1),
        },
        "pollux_s": POLLUX[held_out],
    }


def checkpoints(folder: Path, report: dict[str, Any], *, imitate: bool = True) -> dict[str, Path]:
    """The modules a training run in ``folder`` left for selection (``train_ppo``'s
    ``report``): the imitation (``imitate``), every ``iter_N`` as ``ppo-N``, and the
    last as ``ppo``."""
    found = {"imitation": folder / "warm_start"} if imitate else {}
    for saved in sorted(folder.glob("iter_*")):
        found[f"ppo-{int(saved.name.split('_')[1])}"] = saved
    found["ppo"] = Path(report["checkpoint"])
    return found


def baselines(pollux: Path, workload: int) -> dict[str, Any]:
    """Every baseline's run of ``workload``."""
    rows = {}
    for name in BASELINES:
        rows[name] = play(pollux, workload, lambda env, name=name: POLICIES[name](env, 0))
        print(f"  workload {workload}: {name} {rows[name]['avg_jct_s']:.0f} s", flush=True)
    return {"workload": workload, "pollux_s": POLLUX[workload], "policies": rows}


def pollux_jcts() -> dict[int, dict[str, float]]:
    """Pollux's JCT of every job, by workload (``POLLUX_JCTS``)."""
    data = json.loads(POLLUX_JCTS.read_text())
    return {int(w): {k: float(v) for k, v in jobs.items()} for w, jobs in data["jcts"].items()}


def paired_difference(
    ours: dict[str, float], theirs: dict[str, float], *, draws: int = 4000, seed: int = 0
) -> tuple[float, float, float]:
    """Mean over the same jobs of (ours - theirs), as a share of their average JCT, with
    a 95% bootstrap interval over jobs: (mean, low, high). Every job of ``theirs`` must
    be in ``ours`` (a policy that did not finish a job has no average to compare)."""
    return pooled_difference([(ours, theirs)], draws=draws, seed=seed)


def table(out: Path) -> str:
    """The Markdown table of the folds and baselines in ``out``."""
    folds: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(out.glob("fold-*-seed-*.json")):
        row = json.loads(path.read_text())
        folds[row["held_out"]].append(row)
    base = {
        int(p.stem.split("-")[1]): json.loads(p.read_text())
        for p in sorted(out.glob("baselines-*.json"))
    }
    workloads = sorted(set(folds) | set(base))
    grid_path = out / "teacher-grid.json"
    grid = json.loads(grid_path.read_text()) if grid_path.exists() else {}
    names = ["learned (held out)", "its teacher", *BASELINES]
    lines = [
        "| workload | Pollux (published) | " + " | ".join(f"`{n}`" for n in names) + " |",
        "|---" * (len(names) + 2) + "|",
    ]
    means: dict[str, list[float]] = defaultdict(list)
    wins = 0
    for w in workloads:
        cells = [str(w), f"{POLLUX[w]:,}"]
        runs = folds.get(w, [])
        if runs:
            values = [r["learned"]["avg_jct_s"] for r in runs]
            mean = float(np.mean(values))
            means["learned (held out)"].append(mean)
            wins += mean < POLLUX[w]
            if len(values) > 1:
                interval = mean_t_interval(values)
                assert interval["high"] is not None
                half = interval["high"] - mean
                cells.append(f"**{mean:,.0f}** ± {half:,.0f} ({len(values)} seeds)")
            else:
                lo, hi = runs[0]["learned"]["avg_jct_ci95"]
                cells.append(f"**{mean:,.0f}** [{lo:,.0f}, {hi:,.0f}]")
        else:
            cells.append("")
        chosen_path = out / f"teacher-{w}.json"
        if chosen_path.exists() and grid:
            chosen = json.loads(chosen_path.read_text())
            value = grid[f"{chosen['exponent']},{chosen['p']}"][str(w)]
            means["its teacher"].append(value)
            cells.append(f"{value:,.0f} ({chosen['exponent']:g}, {chosen['p']:g})")
        else:
            cells.append("")
        for name in BASELINES:
            row = base.get(w, {}).get("policies", {}).get(name)
            if row is None:
                cells.append("")
                continue
            means[name].append(row["avg_jct_s"])
            cells.append(f"{row['avg_jct_s']:,.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    full = [n for n in names if len(means[n]) == len(workloads)]
    if len(workloads) > 1:
        mean_cells = ["mean", f"{np.mean([POLLUX[w] for w in workloads]):,.0f}"]
        mean_cells += [f"{np.mean(means[n]):,.0f}" if n in full else "" for n in names]
        lines.append("| " + " | ".join(mean_cells) + " |")
    lines.append(f"\nlearned policy below Pollux on {wins} of {len(folds)} held-out workloads")
    lines.extend(_against_pollux(folds, base, workloads))
    lines.extend(_training(folds))
    lines.extend(_attribution(folds, base))
    return "\n".join(lines)


def ablation(variants: dict[str, Path]) -> str:
    """The Markdown table of training variants side by side (each an ``OUT`` of the
    protocol run its own way: ``label -> folder``), beside the teacher each fold chose:
    per variant, the mean over the held-out workloads of the average JCT (each workload's
    seeds averaged), against the teacher's on the same workloads, on how many it is
    below the teacher, the checkpoints selection picked, and the training steps and
    wall time of a fold. Below each variant, a row per checkpoint every fold weighed
    (``imitation`` only, ``ppo-10``, ...): what each would have given held out, had
    selection picked it."""
    lines = [
        "| variant | held-out workloads | mean average JCT (s) | its teachers' (s) | vs "
        "teacher | below teacher | chosen | PPO env steps / fold | wall / fold (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, out in variants.items():
        folds: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for path in sorted(out.glob("fold-*-seed-*.json")):
            row = json.loads(path.read_text())
            folds[row["held_out"]].append(row)
        grid_path = out / "teacher-grid.json"
        if not folds or not grid_path.exists():
            continue
        grid = json.loads(grid_path.read_text())
        theirs = [
            grid[f"{runs[0]['teacher_exponent']},{runs[0]['fairness_p']}"][str(w)]
            for w, runs in sorted(folds.items())
        ]
        base = float(np.mean(theirs))
        rows = [r for runs in folds.values() for r in runs]
        everywhere = set.intersection(*(set(r.get("candidates", {})) for r in rows))
        for name in [None, *sorted(everywhere)]:
            ours = [
                float(
                    np.mean(
                        [
                            (r["learned"] if name is None else r["candidates"][name])["avg_jct_s"]
                            for r in runs
                        ]
                    )
                )
                for _, runs in sorted(folds.items())
            ]
            mean = float(np.mean(ours))
            below = sum(a < b for a, b in zip(ours, theirs, strict=True))
            if name is None:
                chosen: dict[str, int] = defaultdict(int)
                for r in rows:
                    chosen[r["chosen"]] += 1
                steps = np.mean([r["training"]["ppo_env_steps"] or 0 for r in rows])
                wall = np.mean([r["training"]["wall_s"] for r in rows])
                picked = ", ".join(f"{k} x{v}" for k, v in sorted(chosen.items()))
                head, tail = label, f"{picked} | {steps:,.0f} | {wall:,.0f}"
            else:
                head, tail = f"{label}: `{name}` alone", " | | "
            lines.append(
                f"| {head} | {','.join(str(w) for w in sorted(folds))} | {mean:,.0f} | "
                f"{base:,.0f} | {mean / base - 1:+.2%} | {below} of {len(ours)} | {tail} |"
            )
    return "\n".join(lines)


PAIRED = ("learned (held out)", "goodput-size", "goodput", "tiresias")
"""The policies the job-by-job table sets against Pollux."""


def _job_jcts(
    folds: dict[int, list[dict[str, Any]]], base: dict[int, dict[str, Any]], w: int, name: str
) -> dict[str, float] | None:
    """Per job of workload ``w``: its JCT under ``name`` (the learned policy: averaged
    over its training seeds); ``None`` where the runs did not record jobs."""
    if name == "learned (held out)":
        runs = [r["learned"].get("jct_by_job") for r in folds.get(w, [])]
        if not runs or any(r is None for r in runs):
            return None
        return {job: float(np.mean([r[job] for r in runs])) for job in runs[0]}
    row = base.get(w, {}).get("policies", {}).get(name)
    return None if row is None else row.get("jct_by_job")


def _against_pollux(
    folds: dict[int, list[dict[str, Any]]], base: dict[int, dict[str, Any]], workloads: list[int]
) -> list[str]:
    """Each policy against Pollux on the same jobs: the mean of (its JCT - Pollux's) over
    a workload's jobs as a share of Pollux's average JCT, with a 95% bootstrap interval
    over jobs; "all" pools the workloads (each resampled within itself) against Pollux's
    mean of the eight averages."""
    theirs = pollux_jcts()
    lines = [
        "",
        "Against Pollux on the same jobs (mean of our JCT - Pollux's JCT, over Pollux's "
        "average JCT; 95% bootstrap interval over jobs):",
        "",
        "| workload | " + " | ".join(f"`{n}`" for n in PAIRED) + " |",
        "|---" * (len(PAIRED) + 1) + "|",
    ]
    pooled: dict[str, list[tuple[dict[str, float], dict[str, float]]]] = defaultdict(list)
    for w in workloads:
        cells = [str(w)]
        for name in PAIRED:
            ours = _job_jcts(folds, base, w, name)
            if ours is None:
                cells.append("")
                continue
            mean, lo, hi = paired_difference(ours, theirs[w])
            pooled[name].append((ours, theirs[w]))
            cells.append(f"{mean:+.1%} [{lo:+.1%}, {hi:+.1%}]")
        lines.append("| " + " | ".join(cells) + " |")
    if len(workloads) > 1:
        cells = ["all"]
        for name in PAIRED:
            pairs = pooled.get(name, [])
            if len(pairs) != len(workloads):
                cells.append("")
                continue
            mean, lo, hi = pooled_difference(pairs)
            cells.append(f"{mean:+.1%} [{lo:+.1%}, {hi:+.1%}]")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def pooled_difference(
    pairs: list[tuple[dict[str, float], dict[str, float]]], *, draws: int = 4000, seed: int = 0
) -> tuple[float, float, float]:
    """``paired_difference`` over several workloads: the mean over workloads of each one's
    mean difference, over the mean of Pollux's averages, each workload's jobs resampled
    within it."""
    rng = np.random.default_rng(seed)
    diffs, bases, boots = [], [], []
    for ours, theirs in pairs:
        missing = sorted(set(theirs) - set(ours))
        if missing:
            raise ValueError(f"{len(missing)} job(s) not finished: {', '.join(missing[:3])} ...")
        names = sorted(theirs)
        d = np.array([ours[n] - theirs[n] for n in names])
        diffs.append(d.mean())
        bases.append(np.mean([theirs[n] for n in names]))
        boots.append(d[rng.integers(0, len(d), size=(draws, len(d)))].mean(axis=1))
    base = float(np.mean(bases))
    boot = np.mean(boots, axis=0) / base
    return (float(np.mean(diffs) / base), *percentile_interval(boot, 0.95))


def _training(folds: dict[int, list[dict[str, Any]]]) -> list[str]:
    """Per fold: what training took and which checkpoint the training workloads chose."""
    if not folds:
        return []
    lines = [
        "",
        "| held out | seed | imitation samples | PPO iterations | PPO env steps | wall (s) "
        "| training workloads: imitation / PPO (s) | chosen |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w, runs in sorted(folds.items()):
        for r in sorted(runs, key=lambda r: r["seed"]):
            t, sel = r["training"], r["selection"]
            steps = t.get("ppo_env_steps")
            lines.append(
                f"| {w} | {r['seed']} | {t.get('imitation_samples') or 0:,} | "
                f"{t['ppo_iterations']} | {f'{steps:,.0f}' if steps else ''} | "
                f"{t['wall_s']:,.0f} | {sel.get('imitation', {}).get('mean', math.nan):,.0f} / "
                f"{sel['ppo']['mean']:,.0f} | {r['chosen']} |"
            )
    return lines


def _attribution(
    folds: dict[int, list[dict[str, Any]]], base: dict[int, dict[str, Any]]
) -> list[str]:
    """Where the learned policy is above Pollux: per application, its jobs' JCT, wait
    before their first start and GPUs while running, beside goodput's and the oracle's,
    Pollux's JCT of the same jobs, and the application's share of the gap (the sum of
    its jobs' JCT differences over the workload's jobs: the parts add up to the
    difference of the average JCTs)."""
    lines: list[str] = []
    theirs = pollux_jcts()
    for w, runs in sorted(folds.items()):
        mean = float(np.mean([r["learned"]["avg_jct_s"] for r in runs]))
        if mean < POLLUX[w] or w not in base:
            continue
        policies = base[w]["policies"]
        lines.append(
            f"\nworkload {w}: learned {mean:,.0f} s, {mean / POLLUX[w] - 1:+.1%} vs Pollux "
            f"{POLLUX[w]:,}; goodput {policies['goodput']['avg_jct_s']:,.0f} s, goodput-size "
            f"{policies['goodput-size']['avg_jct_s']:,.0f} s, oracle "
            f"{policies['oracle']['avg_jct_s']:,.0f} s"
        )
        lines.append(
            "| application | jobs | learned JCT / wait / GPUs | goodput | oracle | Pollux JCT "
            "| share of the gap (s) |"
        )
        lines.append("|---|---|---|---|---|---|---|")
        learned = runs[0]["learned"]["per_app"]
        ours = _job_jcts(folds, base, w, "learned (held out)")
        pollux = theirs[w]
        for app, row in learned.items():
            cells = [app, str(row["jobs"])]
            for per in (learned, policies["goodput"]["per_app"], policies["oracle"]["per_app"]):
                r = per.get(app)
                cells.append(
                    f"{r['jct_s']:,.0f} / {r['wait_s']:,.0f} / {r['gpus']:.1f}" if r else ""
                )
            mine = [job for job in pollux if job.rsplit("-", 1)[0] == app]
            cells.append(f"{np.mean([pollux[j] for j in mine]):,.0f}" if mine else "")
            if ours is not None and mine:
                gap = sum(ours[j] - pollux[j] for j in mine) / len(pollux)
                cells.append(f"{gap:+,.0f}")
            else:
                cells.append("")
            lines.append("| " + " | ".join(cells) + " |")
    return lines
