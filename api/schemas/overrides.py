"""Schemas of the overrides routes: the pins an override sets (layout, precision,
compression, placement), an override to create, and overrides as stored."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autotune.api.schemas.common import INTEGRAL, MAX_GPUS, StrictRequest, Whole
from autotune.core import ID_PATTERN, CompressionKind, CompressionSpec, Layout, Precision

__all__ = [
    "CompressionPin",
    "LayoutPin",
    "OverrideCreate",
    "OverridePublic",
    "OverridesPublic",
    "PrecisionPin",
    "RankPin",
]


class LayoutPin(StrictRequest):
    """Layout fields to pin; those not pinned come from the job's current configuration.
    Where world_size, tp and pp are all pinned, dp x tp x pp must equal world_size (dp -1
    or unpinned: world_size / (tp x pp), which must divide). Against the job and the
    cluster (422 with the Planner's reason): world_size within the job's
    min_gpus..max_gpus, tp within a node, and a rank's share of the model in the memory of
    a GPU the job may use."""

    world_size: Annotated[int, Field(ge=1, le=MAX_GPUS), INTEGRAL] | None = Field(
        default=None, description="Ranks (GPUs): dp x tp x pp"
    )
    dp: Annotated[int, Field(ge=-1, le=MAX_GPUS), INTEGRAL] | None = Field(
        default=None,
        json_schema_extra={"not": {"const": 0}},
        description="Data-parallel degree; -1: the rest, world_size / (tp x pp)",
    )
    tp: Annotated[int, Field(ge=1, le=64), INTEGRAL] | None = Field(
        default=None, description="Tensor-parallel degree"
    )
    pp: Annotated[int, Field(ge=1, le=256), INTEGRAL] | None = Field(
        default=None, description="Pipeline stages"
    )
    micro_batches: Annotated[int, Field(ge=1, le=MAX_GPUS), INTEGRAL] | None = Field(
        default=None,
        description="Micro-batches per step (gradient accumulation when pp is 1)",
    )
    activation_checkpointing: bool | None = None

    @field_validator("dp")
    @classmethod
    def _dp_is_a_degree(cls, dp: int | None) -> int | None:
        if dp == 0:
            raise ValueError("dp is -1 (the rest) or a degree of 1 and up")
        return dp

    @model_validator(mode="after")
    def _degrees_multiply_out(self) -> Self:
        if self.world_size is not None and self.tp is not None and self.pp is not None:
            dp = -1 if self.dp is None else self.dp
            Layout(world_size=self.world_size, dp=dp, tp=self.tp, pp=self.pp)
        return self


_PRECISION = "Precision of this module class (default: the job's current one)"


class PrecisionPin(StrictRequest):
    """Precisions to pin per module class. fp8 runs only on GPUs that have it (H100 and
    later): with none the job may use, the pin is a 422."""

    embedding: Precision | None = Field(default=None, description=_PRECISION)
    attention_qkv: Precision | None = Field(default=None, description=_PRECISION)
    attention_out: Precision | None = Field(default=None, description=_PRECISION)
    ffn: Precision | None = Field(default=None, description=_PRECISION)
    norm: Literal["fp32", "bf16", "fp16"] | None = Field(
        default=None, description="Normalisation layers: not fp8"
    )
    head: Precision | None = Field(default=None, description=_PRECISION)
    optimizer_state: Literal["fp32", "bf16"] | None = Field(
        default=None, description="Optimizer moments: fp32 or bf16"
    )

    @field_validator("norm", mode="before")
    @classmethod
    def _norm_not_fp8(cls, value: object) -> object:
        if value == "fp8":  # the likely mistake, said plainly
            raise ValueError("normalisation cannot run in fp8")
        return value


class CompressionPin(StrictRequest):
    """A whole gradient compression: topk takes a ratio, powersgd a rank, the others
    neither."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {
                    "properties": {
                        "kind": {"enum": ["none", "int8", "fp8"]},
                        "ratio": {"type": "null"},
                        "rank": {"type": "null"},
                    }
                },
                {
                    "properties": {
                        "kind": {"const": "topk"},
                        "ratio": {"type": "number"},
                        "rank": {"type": "null"},
                    },
                    "required": ["ratio"],
                },
                {
                    "properties": {
                        "kind": {"const": "powersgd"},
                        "ratio": {"type": "null"},
                        "rank": {"type": "integer"},
                    },
                    "required": ["rank"],
                },
            ]
        }
    )

    kind: CompressionKind
    ratio: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="Share of gradient entries top-k keeps: topk only, and required there",
    )
    rank: Annotated[int, Field(ge=1, le=1024), INTEGRAL] | None = Field(
        default=None,
        description="Rank of the approximation: powersgd only, and required there",
    )

    @model_validator(mode="after")
    def _fits_the_kind(self) -> Self:
        CompressionSpec(kind=self.kind, ratio=self.ratio, rank=self.rank)
        return self


class RankPin(StrictRequest):
    node_id: str = Field(pattern=ID_PATTERN, description="A node of the cluster (else 422)")
    gpu_index: Whole = Field(ge=0, le=1024, description="A GPU of that node: below its gpu_count")


_PIN_TYPES = {
    "layout": "object",
    "precision": "object",
    "compression": "object",
    "placement": "array",
}


class OverrideCreate(StrictRequest):
    """Pin at least one of layout, precision, compression and placement (not null)."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": [key], "properties": {key: {"type": kind}}}
                for key, kind in _PIN_TYPES.items()
            ]
        }
    )

    job_id: str = Field(
        pattern=ID_PATTERN,
        description="A pending or running job (no such job: 404; one that ended: 409)",
    )
    layout: LayoutPin | None = None
    precision: PrecisionPin | None = None
    compression: CompressionPin | None = None
    placement: Annotated[list[RankPin], Field(min_length=1, max_length=MAX_GPUS)] | None = Field(
        default=None,
        json_schema_extra={"uniqueItems": True},
        description="GPU of rank 0, 1, ..., one rank a GPU (pins the world size too: a "
        "layout's world_size must agree); GPUs of the cluster's nodes, of a model the job "
        "may use, with the memory for one rank",
    )
    ttl_s: float = Field(gt=0, le=30 * 86400, description="Seconds until it expires")
    reason: str = Field(
        min_length=1,
        max_length=1000,
        pattern=r"^[^\x00]*$",
        description="Why, for the decision log (no NUL character)",
    )

    @field_validator("placement")
    @classmethod
    def _one_rank_a_gpu(cls, placement: list[RankPin] | None) -> list[RankPin] | None:
        seen: set[tuple[str, int]] = set()
        for slot in placement or ():
            gpu = (slot.node_id, slot.gpu_index)
            if gpu in seen:
                raise ValueError(f"two ranks on one GPU: {slot.node_id}:{slot.gpu_index}")
            seen.add(gpu)
        return placement


class OverridePublic(BaseModel):
    id: int
    job_id: str
    pin: dict[str, Any]
    reason: str
    created_at: datetime
    expires_at: datetime
    deleted_at: datetime | None
    active: bool


class OverridesPublic(BaseModel):
    data: list[OverridePublic]
    count: int
