"""The cursor codec of keyset pagination: the sort key of a page's last row as an
opaque string a client hands back, and that string read back, checked against the
listing's key types (``CursorError`` when no listing handed it out)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

__all__ = ["CursorError", "decode_cursor", "encode_cursor"]


class CursorError(ValueError):
    """A pagination cursor this listing did not hand out."""


def encode_cursor(*values: str | int) -> str:
    """An opaque cursor holding the sort key of a page's last row."""
    raw = json.dumps(list(values), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


_MAX_KEY = 2**63 - 1


def decode_cursor(cursor: str, *types: type) -> tuple[Any, ...]:
    """The sort key in ``cursor``, checked against ``types``; ``CursorError`` if it is not
    one this listing hands out."""
    try:
        values = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise CursorError(f"not a cursor: {cursor[:40]!r}") from None
    if (
        not isinstance(values, list)
        or len(values) != len(types)
        or not all(type(v) is t for v, t in zip(values, types, strict=True))
        # what no listing hands out: ids beyond a 64-bit key, text with NUL (PostgreSQL
        # refuses it) or longer than any key
        or any(isinstance(v, int) and not 0 <= v <= _MAX_KEY for v in values)
        or any(isinstance(v, str) and (len(v) > 256 or "\x00" in v) for v in values)
    ):
        raise CursorError(f"not a cursor of this listing: {cursor[:40]!r}")
    return tuple(values)
