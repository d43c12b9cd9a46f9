"""Helpers of ``bench/gpu_suite.sh``, standard library only (each part imports torch or
pynvml itself, inside a ``try``):

    python3 bench/gpu_suite.py assemble DEST [--block NAMES]
    python3 bench/gpu_suite.py env OUT.json
    python3 bench/gpu_suite.py telemetry OUT.jsonl [--interval S]
    python3 bench/gpu_suite.py merge TMP OUT.json [--junit FILE]

- ``assemble``: the ``autotune`` package as an installation would lay it out (pyproject's
  ``[tool.setuptools.package-dir]``: ``kernels/`` becomes ``autotune/kernels`` ...) under
  DEST, plus this file as the ``gpu_suite`` pytest plugin; with ``--block``, a
  ``sitecustomize`` that makes those top-level modules unimportable (a CPU dry run then
  sees the GPU machine's package set).
- ``env``: Python, torch, Triton, CUDA, the device and its compute capability, the fp8
  path the executor would take, nvidia-smi, and whether the suite's modules import.
- ``telemetry``: NVML samples (power, clocks, temperature, memory, utilisation) every
  ``--interval`` seconds until killed.
- ``merge``: everything under TMP into one JSON.

As a pytest plugin (``-p gpu_suite``) it appends each test's outcome to
``$GPU_SUITE_PROGRESS`` as it runs, so a run cut short by its timeout still says which
tests passed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import tomllib
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SUITE_MODULES = (
    "autotune.kernels",
    "autotune.executor.precision",
    "autotune.executor.worker",
    "autotune.executor.tasks",
)
TAIL = 4000


def _now() -> float:
    return time.time()


# --------------------------------------------------------------------------- assemble


BLOCKER = '''"""Written by bench/gpu_suite.py: modules absent on the GPU machine are not found, as
if not installed (``importlib.util.find_spec`` gives None, ``import`` fails)."""
import sys
from importlib.machinery import PathFinder

BLOCKED = frozenset({names!r})


class _FilteredPathFinder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            return None
        return PathFinder.find_spec(name, path, target)

    @classmethod
    def invalidate_caches(cls):
        PathFinder.invalidate_caches()


sys.meta_path[:] = [_FilteredPathFinder if f is PathFinder else f for f in sys.meta_path]
'''


def assemble(dest: Path, block: list[str]) -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    mapping: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    dest.mkdir(parents=True, exist_ok=True)
    # The root package first, then the mapped subpackages into it.
    for package, folder in sorted(mapping.items(), key=lambda kv: kv[0].count(".")):
        target = dest.joinpath(*package.split("."))
        if target.exists() and package != "autotune":
            shutil.rmtree(target)
        shutil.copytree(REPO / folder, target, ignore=ignore, dirs_exist_ok=True)
    shutil.copy2(Path(__file__), dest / "gpu_suite.py")
    if block:
        blocker = dest.parent / "block"
        blocker.mkdir(exist_ok=True)
        (blocker / "sitecustomize.py").write_text(BLOCKER.format(names=sorted(block)))
    print(f"assembled {', '.join(sorted(mapping))} under {dest}")


# --------------------------------------------------------------------------- env


def _run(command: list[str], timeout: float = 20) -> dict[str, Any]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        return {"rc": done.returncode, "stdout": done.stdout[-TAIL:], "stderr": done.stderr[-TAIL:]}
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": repr(exc)}


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": sys.version,
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"),
        "PYTHONPATH": os.environ.get("PYTHONPATH"),
    }
    smi = shutil.which("nvidia-smi")
    env["nvidia_smi"] = (
        _run(
            [
                smi,
                "--query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm,"
                "clocks.max.mem,temperature.gpu,compute_cap",
                "--format=csv",
            ]
        )
        if smi
        else {"error": "nvidia-smi not found"}
    )
    if smi:
        env["nvidia_smi_full"] = _run([smi])
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        env["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            env["device_name"] = torch.cuda.get_device_name(0)
            env["capability"] = list(torch.cuda.get_device_capability(0))
            env["device_memory_bytes"] = int(props.total_memory)
            env["multiprocessors"] = int(props.multi_processor_count)
    except Exception as exc:
        env["torch_error"] = repr(exc)
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as exc:
        env["triton_error"] = repr(exc)
    imports: dict[str, Any] = {}
    for name in SUITE_MODULES:
        try:
            module = __import__(name, fromlist=["_"])
            imports[name] = {"ok": True, "file": getattr(module, "__file__", None)}
        except Exception as exc:
            imports[name] = {"ok": False, "error": repr(exc), "traceback": traceback.format_exc()}
    env["imports"] = imports
    try:
        from autotune.executor.precision import scaled_mm_supported, select_fp8_mode
        from autotune.kernels import backend

        device = "cuda" if env.get("cuda_available") else "cpu"
        env["fp8_mode"] = select_fp8_mode(device)
        env["scaled_mm_supported"] = scaled_mm_supported(device)
        env["kernel_backend"] = backend(device)
    except Exception as exc:
        env["fp8_error"] = repr(exc)
    try:
        import pynvml

        pynvml.nvmlInit()
        env["nvml_driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
        env["nvml_devices"] = int(pynvml.nvmlDeviceGetCount())
    except Exception as exc:
        env["nvml_error"] = repr(exc)
    return env


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------- telemetry


def telemetry(out: Path, interval: float, index: int = 0) -> None:
    """Append one NVML sample per ``interval`` to ``out`` until killed."""
    with out.open("a") as f:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            f.write(json.dumps({"t": _now(), "error": repr(exc)}) + "\n")
            return
        n = pynvml
        readers: dict[str, Any] = {
            "power_w": lambda: n.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "sm_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_MEM),
            "temperature_c": lambda: n.nvmlDeviceGetTemperature(handle, n.NVML_TEMPERATURE_GPU),
            "memory_used_bytes": lambda: n.nvmlDeviceGetMemoryInfo(handle).used,
            "gpu_util_pct": lambda: n.nvmlDeviceGetUtilizationRates(handle).gpu,
            "mem_util_pct": lambda: n.nvmlDeviceGetUtilizationRates(handle).memory,
            "throttle_reasons": lambda: n.nvmlDeviceGetCurrentClocksThrottleReasons(handle),
        }
        try:
            limit = n.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
            f.write(json.dumps({"t": _now(), "power_limit_w": limit}) + "\n")
        except Exception as exc:
            f.write(json.dumps({"t": _now(), "power_limit_error": repr(exc)}) + "\n")
        while True:
            sample: dict[str, Any] = {"t": _now()}
            for key, read in readers.items():
                try:
                    sample[key] = read()
                except Exception:
                    sample[key] = None
            f.write(json.dumps(sample) + "\n")
            f.flush()
            time.sleep(interval)


def _summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"samples": len(samples)}
    for key in ("power_w", "sm_clock_mhz", "mem_clock_mhz", "temperature_c",
                "memory_used_bytes", "gpu_util_pct"):  # fmt: skip
        values = [s[key] for s in samples if isinstance(s.get(key), int | float)]
        if values:
            out[key] = {
                "mean": statistics.fmean(values),
                "max": max(values),
                "min": min(values),
            }
    reasons = {s.get("throttle_reasons") for s in samples} - {None, 0}
    if reasons:
        out["throttle_reasons_seen"] = sorted(reasons)
    if len(samples) >= 2 and "power_w" in out:
        # energy by the trapezoid rule over the samples' own times
        energy = 0.0
        for a, b in itertools.pairwise(samples):
            pa, pb = a.get("power_w"), b.get("power_w")
            if isinstance(pa, int | float) and isinstance(pb, int | float):
                energy += (pa + pb) / 2 * (b["t"] - a["t"])
        out["energy_j"] = energy
    return out


# --------------------------------------------------------------------------- merge


def _read_json(path: Path) -> Any:
    if not path.exists():
        return {"missing": str(path.name)}
    try:
        return json.loads(path.read_text())
    except Exception as exc:
        return {"unreadable": str(path.name), "error": repr(exc)}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by the kill
    return rows


def junit_summary(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"missing": path.name}
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        return {"unreadable": path.name, "error": repr(exc)}
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    totals: dict[str, Any] = {
        k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")
    }
    totals["time_s"] = sum(float(s.get("time", 0)) for s in suites)
    failed = []
    for case in root.iter("testcase"):
        for kind in ("failure", "error"):
            node = case.find(kind)
            if node is not None:
                failed.append(
                    {
                        "test": f"{case.get('classname')}::{case.get('name')}",
                        "kind": kind,
                        "message": (node.get("message") or "")[:500],
                        "text": (node.text or "")[-1500:],
                    }
                )
    skipped: dict[str, int] = {}
    for case in root.iter("testcase"):
        node = case.find("skipped")
        if node is not None:
            reason = (node.get("message") or "")[:200]
            skipped[reason] = skipped.get(reason, 0) + 1
    return {**totals, "failed": failed[:50], "skip_reasons": skipped}


def progress_summary(path: Path) -> dict[str, Any]:
    rows = _read_jsonl(path)
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    slowest = sorted(rows, key=lambda r: -r.get("duration", 0))[:10]
    return {
        "reports": len(rows),
        "outcomes": outcomes,
        "last": rows[-1]["nodeid"] if rows else None,
        "failed": [
            {"test": r["nodeid"], "error": r.get("error")} for r in rows if r["outcome"] == "failed"
        ][:50],
        "slowest": [{"test": r["nodeid"], "s": r.get("duration")} for r in slowest],
    }


def merge(tmp: Path, out: Path, junit: Path | None) -> dict[str, Any]:
    steps = _read_jsonl(tmp / "steps.jsonl")
    for step in steps:
        log = tmp / f"{step['name']}.out"
        if log.exists() and not step.get("ok"):
            step["output_tail"] = log.read_text(errors="replace")[-TAIL:]
    samples = _read_jsonl(tmp / "telemetry.jsonl")
    readings = [s for s in samples if "power_w" in s]
    telemetry_report: dict[str, Any] = {
        "interval_s": float(os.environ.get("GPU_SUITE_TELEMETRY_INTERVAL", "0.5")),
        "errors": [s["error"] for s in samples if "error" in s],
        "power_limit_w": next((s["power_limit_w"] for s in samples if "power_limit_w" in s), None),
        "whole_run": _summary(readings),
        "per_step": {
            step["name"]: _summary([s for s in readings if step["start"] <= s["t"] <= step["end"]])
            for step in steps
            if "start" in step and "end" in step
        },
    }
    report: dict[str, Any] = {
        "suite": "bench/gpu_suite.sh",
        "dry_run": os.environ.get("GPU_SUITE_DRY_RUN") == "1",
        "ok": bool(steps) and all(s.get("ok") for s in steps),
        "steps": steps,
        "env": _read_json(tmp / "env.json"),
        "tests": {
            "junit": junit_summary(junit) if junit else None,
            "progress": progress_summary(tmp / "pytest-progress.jsonl"),
        },
        "kernels": _read_json(tmp / "kernels.json"),
        "executor": _read_json(tmp / "executor.json"),
        "telemetry": telemetry_report,
    }
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return report


# --------------------------------------------------------------------------- pytest plugin


def pytest_runtest_logreport(report: Any) -> None:
    """Each test's outcome, appended as it is known (``-p gpu_suite``)."""
    path = os.environ.get("GPU_SUITE_PROGRESS")
    if not path or not (report.when == "call" or report.outcome != "passed"):
        return
    with open(path, "a") as f:
        f.write(
            json.dumps(
                {
                    "nodeid": report.nodeid,
                    "when": report.when,
                    "outcome": report.outcome,
                    "duration": round(float(report.duration), 4),
                    **(
                        {"error": str(report.longrepr).strip().splitlines()[-1][:300]}
                        if report.failed and report.longrepr
                        else {}
                    ),
                }
            )
            + "\n"
        )


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("assemble")
    p.add_argument("dest", type=Path)
    p.add_argument("--block", default="", help="comma-separated top-level modules to block")
    p = sub.add_parser("env")
    p.add_argument("out", type=Path)
    p = sub.add_parser("telemetry")
    p.add_argument("out", type=Path)
    p.add_argument("--interval", type=float, default=0.5)
    p = sub.add_parser("merge")
    p.add_argument("tmp", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--junit", type=Path)
    args = parser.parse_args(argv)
    if args.command == "assemble":
        assemble(args.dest, [b for b in args.block.split(",") if b])
    elif args.command == "env":
        env = environment()
        args.out.write_text(json.dumps(env, indent=1, default=str) + "\n")
        failed = [name for name, r in env["imports"].items() if not r["ok"]]
        print(json.dumps({k: env.get(k) for k in ("torch", "triton", "device_name",
                                                  "capability", "fp8_mode")}))  # fmt: skip
        if failed:
            print(f"imports failed: {', '.join(failed)}", file=sys.stderr)
            return 1
    elif args.command == "telemetry":
        telemetry(args.out, args.interval)
    else:
        report = merge(args.tmp, args.out, args.junit)
        print(summary(report))
        print(f"wrote {args.out}: ok={report['ok']}")
    return 0


def summary(report: dict[str, Any]) -> str:
    """A few lines for the terminal: each step, the tests, the goals, the executor."""
    lines = []
    for s in report["steps"]:
        state = (
            "ok"
            if s.get("ok")
            else f"FAILED rc={s.get('rc')}" + (" (timed out)" if s.get("timed_out") else "")
        )
        if s.get("skipped"):
            state = f"skipped ({s['skipped']})"
        lines.append(f"step {s['name']}: {state} in {s.get('seconds', 0):.0f}s")
    env = report.get("env", {})
    lines.append(
        f"device {env.get('device_name', 'cpu')} capability {env.get('capability')} "
        f"torch {env.get('torch')} triton {env.get('triton')} fp8 {env.get('fp8_mode')}"
    )
    junit = (report.get("tests") or {}).get("junit") or {}
    if "tests" in junit:
        lines.append(
            f"tests: {junit['tests']} run, {junit['failures']} failed, {junit['errors']} "
            f"errors, {junit['skipped']} skipped"
        )
        lines += [f"  FAILED {f['test']}: {f['message'][:160]}" for f in junit["failed"][:10]]
    kernels = report.get("kernels") or {}
    for g in kernels.get("goals", []):
        value = g.get("value")
        shown = f"{value:.2f}" if isinstance(value, int | float) else "n/a"
        lines.append(f"goal {g['goal']}: {shown} (target {g['target']}) met={g['met']}")
    for e in kernels.get("errors", []):
        lines.append(f"kernel bench FAILED {e['kernel']} at {e['elements']}: {e['error'][:200]}")
    for r in (report.get("executor") or {}).get("rows", []):
        if "error" in r or "skipped" in r:
            lines.append(f"executor {r['config']}: {r.get('error') or r.get('skipped')}")
            continue
        lines.append(
            f"executor {r['config']}: {r['step_time_s_median'] * 1e3:.1f} ms/step, "
            f"{r['tokens_per_s']:.0f} tokens/s, peak {r['peak_memory_bytes'] / 2**30:.2f} GiB, "
            f"fp8 {r.get('fp8_mode')} {r.get('fp8_calls') or ''}, power {r.get('power_watts_mean')}"
        )
    whole = report.get("telemetry", {}).get("whole_run", {})
    if "power_w" in whole:
        lines.append(f"power W (whole run): {whole['power_w']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
