"""JSON round-trips of the core dataclasses, through pydantic's ``TypeAdapter``.

The dataclasses stay plain stdlib dataclasses with their own ``__post_init__`` checks;
pydantic only walks the fields, so validation runs exactly once, in the dataclass. A
validation error is a ``pydantic.ValidationError``, which is a ``ValueError``.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import TypeAdapter

T = TypeVar("T")

__all__ = ["from_json", "to_json"]


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(cls: type[Any]) -> TypeAdapter[Any]:
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


def to_json(obj: object) -> Any:
    """A JSON-ready value (dicts, lists, strings, numbers) for a core dataclass."""
    return _adapter(type(obj)).dump_python(obj, mode="json")


def from_json(cls: type[T], data: Any) -> T:
    """Rebuild ``cls`` from what ``to_json`` produced; raises ``ValueError`` when invalid."""
    value: T = _adapter(cls).validate_python(data)
    return value
