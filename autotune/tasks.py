"""What a submitted job may train: built-in tasks, or ``package.module:Name`` tasks of
modules on the settings' allow-list (``task_modules``).

A task name is only ever checked against these two lists here; nothing is imported
for it, and a file path is never accepted, so a request cannot make the daemon run
code of its choosing. The backend that trains jobs for real imports an allow-listed
module when it starts the job.

Each built-in task comes with the ``ModelProfile`` the Planner and the simulator use.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from autotune.core import ModelProfile
from autotune.models import MODEL_CATALOG, transformer

__all__ = ["BUILTIN_TASKS", "Task", "resolve_task"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    name: str
    model: ModelProfile | None
    """``None`` for a module task: its shape is unknown until the backend loads it."""
    builtin: bool


# The executor's built-in gpt-char (autotune.executor.tasks.GPTConfig): 4 blocks of width
# 128, 4 heads, 64 bytes of context, a 256-byte vocabulary; about 0.86 M parameters.
_GPT_CHAR: Final = transformer("gpt-char", hidden=128, layers=4, heads=4, seq_len=64, vocab=256)

BUILTIN_TASKS: Final[MappingProxyType[str, ModelProfile]] = MappingProxyType(
    {"gpt-char": _GPT_CHAR, **MODEL_CATALOG}
)

_MODULE_TASK: Final = re.compile(
    r"^(?P<module>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):[A-Za-z_][A-Za-z0-9_]*$"
)


def resolve_task(name: str, allowed_modules: Sequence[str]) -> Task:
    """The task ``name`` stands for; ``ValueError`` saying why when it is not allowed."""
    if name in BUILTIN_TASKS:
        return Task(name=name, model=BUILTIN_TASKS[name], builtin=True)
    match = _MODULE_TASK.match(name)
    if match is None:
        raise ValueError(
            f"task {name!r}: not a built-in task ({', '.join(sorted(BUILTIN_TASKS))}) "
            "nor package.module:Name"
        )
    module = match.group("module")
    if not any(
        module == allowed or module.startswith(allowed + ".") for allowed in allowed_modules
    ):
        raise ValueError(
            f"task {name!r}: module {module!r} is not on the allow-list (setting task_modules)"
        )
    return Task(name=name, model=None, builtin=False)
