"""The arrows of the design (``shared/DESIGN.md`` section 2; the README's Layout), read
from the code: which folder may import which. Every import counts, at module level or
inside a function, so a lazy import cannot hide an arrow pointing the wrong way."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import REPO

# Folder -> the import name it is installed under (pyproject.toml's package-dir).
FOLDERS = {
    "autotune": "autotune",
    "envs": "autotune.envs",
    "policies": "autotune.policies",
    "executor": "autotune.executor",
    "kernels": "autotune.kernels",
    "api": "autotune.api",
    "studies": "autotune.studies",
    "benchmarks": "autotune.benchmarks",
}


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module) of every import in a file, wherever it stands."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return _imports_in(path.read_text(), package)


def _imports_in(text: str, package: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module) of every import in ``text``, a module of ``package``."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                yield node.lineno, f"{base}.{node.module}" if node.module else base
            elif node.module:
                yield node.lineno, node.module


def _module_name(path: Path) -> str:
    relative = path.relative_to(REPO).with_suffix("")
    folder, *rest = relative.parts
    parts = [FOLDERS[folder], *rest]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


def _violations(folder: str, allowed: Callable[[Path, str], bool]) -> list[str]:
    found = []
    for path in _sources(folder):
        for line, module in _imports(path):
            if module.split(".")[0] == "autotune" and not allowed(path, module):
                found.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    return found


def test_every_folder_is_read() -> None:
    for folder in FOLDERS:
        assert _sources(folder), f"no Python files under {folder}/"


def test_kernels_import_nothing_of_the_project() -> None:
    assert _violations("kernels", lambda _p, m: m.startswith("autotune.kernels")) == []


def test_envs_never_import_the_executor_the_api_the_daemon_or_policies() -> None:
    """The environment runs the core's decision step (``autotune.decision``), never the
    daemon's."""
    forbidden = (
        "autotune.executor",
        "autotune.api",
        "autotune.daemon",
        "autotune.cli",
        "autotune.policies",
        "autotune.db",
    )

    def allowed(_path: Path, module: str) -> bool:
        return module == "autotune.decision.step" or not module.startswith(forbidden)

    assert _violations("envs", allowed) == []


def test_the_decision_step_stays_pure() -> None:
    """The decision step and the reinforcement-learning contract, which the environment,
    the daemon and replay share, reach no storage, daemon or command line."""
    forbidden = ("autotune.db", "autotune.api", "autotune.cli", "autotune.daemon")
    found = [
        v
        for v in _violations("autotune", lambda _p, m: not m.startswith(forbidden))
        if v.startswith(("autotune/decision/", "autotune/rl/"))
    ]
    assert found == []


def test_policies_reach_storage_only_through_autotune() -> None:
    forbidden = ("autotune.db", "autotune.api", "autotune.executor", "autotune.cli")
    assert _violations("policies", lambda _p, m: not m.startswith(forbidden)) == []


def test_the_executor_decides_nothing() -> None:
    forbidden = (
        "autotune.envs",
        "autotune.policies",
        "autotune.api",
        "autotune.cli",
        "autotune.daemon",
        "autotune.db",
        "autotune.planner",
    )
    assert _violations("executor", lambda _p, m: not m.startswith(forbidden)) == []


def test_the_api_holds_no_cluster_model_policy_or_executor() -> None:
    forbidden = ("autotune.envs", "autotune.policies", "autotune.executor", "autotune.cli")
    assert _violations("api", lambda _p, m: not m.startswith(forbidden)) == []


# Only the command line and the daemon's backend registry choose the pieces the daemon is
# assembled from; the rest of `autotune` knows them through the interfaces.
ASSEMBLERS = ("autotune/cli/", "autotune/daemon/backends.py")


@pytest.mark.parametrize("target", ["autotune.envs", "autotune.policies", "autotune.executor"])
def test_only_the_cli_and_the_backend_registry_import_the_outer_folders(target: str) -> None:
    def allowed(path: Path, module: str) -> bool:
        where = path.relative_to(REPO).as_posix()
        return not module.startswith(target) or where.startswith(ASSEMBLERS)

    assert _violations("autotune", allowed) == []


def test_the_core_imports_no_daemon_storage_or_command_line() -> None:
    """The pure core a reader starts with: types, interfaces, the Planner, the catalog and
    the physics."""
    core = [
        "core.py",
        "interfaces.py",
        "planner",
        "serde.py",
        "errors.py",
        "csvfile.py",
        "catalog",
        "perf",
        "decision",
        "rl",
    ]
    forbidden = ("autotune.daemon", "autotune.db", "autotune.cli", "autotune.api")
    found = [
        v
        for v in _violations("autotune", lambda _p, m: not m.startswith(forbidden))
        if v.split("/")[1].split(":")[0] in core
    ]
    assert found == []


@pytest.mark.parametrize("folder", ["autotune", "envs", "policies", "executor", "kernels", "api"])
def test_the_product_imports_no_study_and_no_benchmark(folder: str) -> None:
    """Studies plug in from outside (entry points, a physics passed to the simulator, an
    environment wrapper) and benchmarks measure from outside: nothing of the product
    names them in an import."""
    outside = ("autotune.studies", "autotune.benchmarks")
    assert _violations(folder, lambda _p, m: not m.startswith(outside)) == []


def test_a_study_reaches_storage_and_the_daemon_only_through_the_product() -> None:
    forbidden = ("autotune.db", "autotune.daemon", "autotune.api")
    assert _violations("studies", lambda _p, m: not m.startswith(forbidden)) == []


def test_the_reader_sees_lazy_and_relative_imports() -> None:
    """Imports inside functions and relative ones count, so the rules above can fail."""
    text = (
        "import os\n"
        "from . import settings\n"
        "def build():\n"
        "    from autotune.executor.runner import JobRunner\n"
        "from ..envs import traces\n"
    )
    modules = sorted(m for _line, m in _imports_in(text, "autotune.daemon"))
    assert modules == ["autotune.daemon", "autotune.envs", "autotune.executor.runner", "os"]
