"""What the schemas of several routers share: the strict base of request bodies, JSON
integers (``Whole``), one-line text (``LINE_PATTERN``), the GPU bound of a request, and
``Paged``, the envelope of a page of a listing."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

__all__ = ["INTEGRAL", "LINE_PATTERN", "MAX_GPUS", "Paged", "StrictRequest", "Whole"]


class StrictRequest(BaseModel):
    """The base of request bodies: strict types (``"4"`` is not an integer), unknown
    fields rejected."""

    model_config = ConfigDict(extra="forbid", strict=True)


LINE_PATTERN = r"^[^\x00-\x1f\x7f]*$"
"""Text of one line: no control characters (PostgreSQL stores no NUL, a name has no
newline)."""
MAX_GPUS = 4096


def _whole(value: object) -> object:
    """A float with no fraction as the integer it is: JSON Schema's integer (``4.0`` is
    one); other floats, strings and booleans stay wrong for the strict int."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


INTEGRAL = BeforeValidator(_whole)
Whole = Annotated[int, INTEGRAL]
"""A JSON integer: ``4`` or ``4.0``, not ``4.5`` nor ``"4"``. Bounds of an optional one go
before ``INTEGRAL`` (``Annotated[int, Field(ge=1), INTEGRAL] | None``): after it,
pydantic writes them into the JSON schema as ``ge``/``le``, which no JSON Schema reads."""


_COUNT = (
    "Rows matching the filters over all pages: exact up to 10,000 (count_exact), else a lower bound"
)
_COUNT_EXACT = "Whether count is exact; false: more than count rows match"
_NEXT = (
    "Cursor of the next page (pass it as cursor=); null on the last page. Pages by "
    "cursor cost the same at any depth and never shift when new rows arrive"
)


class Paged(BaseModel):
    count: int = Field(description=_COUNT)
    count_exact: bool = Field(True, description=_COUNT_EXACT)
    next: str | None = Field(None, description=_NEXT)
