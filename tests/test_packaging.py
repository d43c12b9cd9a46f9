"""Packaging promises: the folder mapping, a light ``import autotune``, lint and types."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from autotune.cli.main import HELP_COLUMNS_WITHOUT_TERMINAL


@pytest.mark.parametrize(
    ("module", "folder"),
    [
        ("autotune.envs", "envs"),
        ("autotune.policies", "policies"),
        ("autotune.executor", "executor"),
        ("autotune.kernels", "kernels"),
        ("autotune.api", "api"),
        ("autotune.studies", "studies"),
    ],
)
def test_subpackages_live_in_their_top_level_folders(module: str, folder: str) -> None:
    path = Path(importlib.import_module(module).__file__ or "").resolve()
    assert path == (REPO / folder / "__init__.py").resolve()


# Scripts that run where the package is not installed: the GPU suite (it assembles the
# package on the device machine) and the anchor that runs inside Sia's own simulator.
STANDALONE = {"gpu_suite.py", "sia_fifo_anchor.py"}
BENCH_SCRIPTS = sorted(p.stem for p in (REPO / "bench").glob("*.py") if p.name not in STANDALONE)


@pytest.mark.parametrize("name", BENCH_SCRIPTS)
def test_a_bench_script_only_runs_its_benchmark(name: str) -> None:
    """``bench/<name>.py`` runs ``autotune.benchmarks.<name>.main`` and holds nothing else:
    what it measures is package code that tests import. ``STANDALONE`` scripts run where
    the package is not installed."""
    text = (REPO / "bench" / f"{name}.py").read_text()
    assert f"from autotune.benchmarks.{name} import main\n" in text
    assert len(text.splitlines()) <= 12
    assert callable(importlib.import_module(f"autotune.benchmarks.{name}").main)


@pytest.mark.subprocess
def test_import_autotune_and_its_core_pulls_no_heavy_framework(tmp_path: Path) -> None:
    code = (
        "import sys, autotune, autotune.core, autotune.planner, autotune.cli\n"
        "import autotune.daemon.tick, autotune.decision.step, autotune.rl.observation\n"
        "heavy = [m for m in ('ray', 'torch', 'ray.rllib', 'gymnasium', 'triton')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == ""


def test_cli_help_explains_every_command() -> None:
    from typer.testing import CliRunner

    from autotune.cli import app

    runner = CliRunner()
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0
    for command in ("daemon", "plan", "db", "version"):
        assert command in top.stdout
        assert runner.invoke(app, [command, "--help"]).exit_code == 0


def _help(*args: str, columns: str | None) -> list[str]:
    """``autotune ARGS --help`` as a person reads it, with no terminal (a pipe, no
    controlling terminal) and ``COLUMNS`` as given."""
    from helpers import autotune_command

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    if columns is not None:
        env["COLUMNS"] = columns
    done = subprocess.run(
        [*autotune_command(), *args, "--help"],
        capture_output=True,
        text=True,
        env=env,
        start_new_session=True,
        check=True,
    )
    return done.stdout.splitlines()


@pytest.mark.subprocess
def test_help_is_drawn_at_the_terminals_width_with_whole_paragraphs() -> None:
    wide = _help("train-policy", columns="200")
    assert max(len(line) for line in wide) == 200
    # A paragraph of the docstring is one paragraph, wrapped by the terminal, not at the
    # source's line breaks: at 200 columns, three lines (the source has six).
    start = next(i for i, line in enumerate(wide) if "observation carries" in line)
    assert "Episodes are windows of Alibaba pods (--trace/--nodes)" in wide[start]
    assert wide[start + 3].strip() == ""
    # No terminal at all (a file, a CI log): 120 columns, the option's help in sentences.
    piped = _help("train-policy", columns=None)
    assert max(len(line) for line in piped) == HELP_COLUMNS_WITHOUT_TERMINAL
    assert any("Checkpoint folder to write. [required]" in line for line in piped)


def tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: install the dev extra (pip install -e '.[dev]')")
    return found


@pytest.mark.lint
def test_ruff_is_clean() -> None:
    done = subprocess.run([tool("ruff"), "check", "."], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run(
        [tool("ruff"), "format", "--check", "."], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.lint
def test_mypy_is_clean() -> None:
    done = subprocess.run(
        [
            tool("mypy"),
            *("autotune", "envs", "policies", "executor", "kernels", "api"),
            *("studies", "benchmarks"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
