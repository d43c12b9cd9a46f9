"""The README's test command is the one CI runs."""

from __future__ import annotations

from helpers import REPO


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    commands = [line for line in readme.splitlines() if line.startswith("python3 -m venv")]
    assert len(commands) == 2, "the README has an install+run and an install+test command"
    assert commands[1].endswith(".venv/bin/pytest")
    assert commands[1] in ci.splitlines()
    assert commands[0].endswith(".venv/bin/autotune daemon")
