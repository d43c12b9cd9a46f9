"""Hugging Face ``transformers`` models as tasks: ``hf:<architecture>[-<size>]``.

``hf:gpt2`` (GPT-2 small), ``hf:gpt2-medium``, ``hf:llama-1b``, ``hf:bert-large``, ...
(``SIZES`` lists them; ``-tiny`` is a two-block model for tests and smoke runs). The
model is built from a configuration made here, with random weights: nothing is fetched
from a hub. It trains on the built-in text, the interpreter's standard-library sources
as bytes (the causal models predict the next byte, BERT fills masked bytes), keeping
the published vocabulary as the catalog's GPTs do. Needs the ``hf`` extra
(``pip install 'autotune[hf]'``); without it, naming such a task says so.

What the executor needs from a model, made from the ``transformers`` one
(``HFTransformer``):

- **Blocks**: the decoder (encoder) layers are the block stack (``blocks``), where
  pipeline stages are cut and activations checkpointed. Each block takes the
  activation and gives the activation; what a layer needs besides (Llama's rotary
  position embeddings) it computes from the activation itself, so a later pipeline
  stage needs nothing from before its first block. Attention is causal for GPT-2 and
  Llama and bidirectional for BERT through ``scaled_dot_product_attention`` with no
  mask (every sample is a full window).
- **Untied head**: embedding and output projection are separate weights (the published
  GPT-2 and BERT tie them), because a pipeline cut may put them on different stages.
- **Linear layers**: GPT-2's ``Conv1D`` projections become the ``nn.Linear`` they
  compute (weights transposed), which tensor parallelism and fp8 need.
- **Tensor-parallel plans**: Llama's is the one ``transformers`` ships (its ``tp_plan``:
  q/k/v and gate/up column-wise, o and down row-wise; the embedding and head stay
  replicated); BERT's pairs query/key/value with the attention output and the
  intermediate with the output dense layer; GPT-2's shards the MLP pair only, because its
  attention computes q, k and v in one fused projection that it splits at a fixed
  width. Dropout is off.

The catalog counts each one's profile from the same configuration
(``autotune.catalog.hf.hf_profile``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, cast

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from autotune.catalog.hf import EXTRA_HINT, SIZES, parse_hf_name
from autotune.executor.tasks import (
    IGNORE,
    TaskError,
    _shard,
    masked_byte_batches,
    next_byte_batches,
)

__all__ = ["HFTask", "HFTransformer", "build_hf_model"]


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise TaskError(
            f"Hugging Face tasks need the transformers package: {EXTRA_HINT} ({exc})"
        ) from exc
    return transformers


# --------------------------------------------------------------------------------------
# The model as the executor sees it
# --------------------------------------------------------------------------------------


class _Block(nn.Module):
    """One ``transformers`` layer: the activation in, the activation out. ``rotary``:
    the model's rotary embedding, computed here from the activation's length."""

    def __init__(self, layer: nn.Module, rotary: nn.Module | None = None) -> None:
        super().__init__()
        self.layer = layer
        self.rotary = rotary

    def forward(self, hidden: Tensor) -> Tensor:
        kwargs: dict[str, Any] = {}
        if self.rotary is not None:
            positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
            kwargs["position_embeddings"] = self.rotary(hidden, positions)
        out = self.layer(hidden, attention_mask=None, **kwargs)
        return cast(Tensor, out[0] if isinstance(out, tuple) else out)


class _GPT2Embedding(nn.Module):
    def __init__(self, wte: nn.Module, wpe: nn.Module) -> None:
        super().__init__()
        self.wte = wte
        self.wpe = wpe

    def forward(self, ids: Tensor) -> Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        out: Tensor = self.wte(ids) + self.wpe(positions)
        return out


class HFTransformer(nn.Module):
    """A ``transformers`` language model as the executor's model: ``embed``, the block
    stack ``blocks``, ``final`` (the last norm, or identity) and ``lm_head``; its
    forward maps token ids to logits."""

    def __init__(
        self,
        embed: nn.Module,
        blocks: list[_Block],
        final: nn.Module,
        lm_head: nn.Module,
        *,
        plan_suffixes: Mapping[str, str],
    ) -> None:
        super().__init__()
        self.embed = embed
        self.blocks = nn.ModuleList(blocks)
        self.final = final
        self.lm_head = lm_head
        self.plan_suffixes = dict(plan_suffixes)

    def forward(self, ids: Tensor) -> Tensor:
        hidden = self.embed(ids)
        for block in self.blocks:
            hidden = block(hidden)
        out: Tensor = self.lm_head(self.final(hidden))
        return out

    def tp_plan(self) -> dict[str, str]:
        return {
            f"blocks.{i}.layer.{suffix}": style
            for i in range(len(self.blocks))
            for suffix, style in self.plan_suffixes.items()
        }


def _as_linear(model: nn.Module, conv1d: type) -> None:
    """Every ``transformers`` ``Conv1D`` (``x @ W + b``) in ``model`` as the ``nn.Linear``
    it computes."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, conv1d):
                weight, bias = cast(Tensor, child.weight), cast(Tensor, child.bias)
                n_in, n_out = weight.shape
                linear = nn.Linear(n_in, n_out, device=weight.device)
                with torch.no_grad():
                    linear.weight.copy_(weight.t())
                    linear.bias.copy_(bias)
                setattr(parent, name, linear)


def _shipped_plan(model: nn.Module, config: Any) -> dict[str, str]:
    """The per-layer part of the tensor-parallel plan ``transformers`` ships with the
    model (``layers.*.<suffix>`` -> style), its column- and row-wise entries."""
    shipped = getattr(model, "_tp_plan", None) or getattr(config, "base_model_tp_plan", None)
    suffixes = {}
    for pattern, style in dict(shipped or {}).items():
        head, star, suffix = pattern.partition(".*.")
        if star and head.split(".")[-1] == "layers" and style in ("colwise", "rowwise"):
            suffixes[suffix] = style
    return suffixes


_NO_SPECIAL: Final = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
"""Byte-level text has no special tokens (GPT-2's 50256 is outside a tiny vocabulary)."""

_BERT_PLAN: Final = {
    "attention.self.query": "colwise",
    "attention.self.key": "colwise",
    "attention.self.value": "colwise",
    "attention.output.dense": "rowwise",
    "intermediate.dense": "colwise",
    "output.dense": "rowwise",
}
_GPT2_PLAN: Final = {"mlp.c_fc": "colwise", "mlp.c_proj": "rowwise"}


def build_hf_model(arch: str, size: str) -> HFTransformer:
    """The model ``hf:<arch>-<size>`` names, initialised at random (``transformers``' own
    initialisation), as the executor trains it."""
    transformers = _transformers()
    spec = SIZES[arch]
    config = getattr(transformers, spec.config_class)(
        **spec.sizes[size].config,
        **_NO_SPECIAL,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if hasattr(config, key):
            setattr(config, key, 0.0)
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "attention_dropout"):
        if hasattr(config, key):
            setattr(config, key, 0.0)
    model = getattr(transformers, spec.model_class)(config)
    if arch == "gpt2":
        from transformers.pytorch_utils import Conv1D

        _as_linear(model, Conv1D)
        body = model.transformer
        return HFTransformer(
            _GPT2Embedding(body.wte, body.wpe),
            [_Block(layer) for layer in body.h],
            body.ln_f,
            model.lm_head,
            plan_suffixes=_GPT2_PLAN,
        )
    if arch == "llama":
        body = model.model
        return HFTransformer(
            body.embed_tokens,
            [_Block(layer, type(body.rotary_emb)(config)) for layer in body.layers],
            body.norm,
            model.lm_head,
            plan_suffixes=_shipped_plan(model, config),
        )
    body = model.bert
    return HFTransformer(
        body.embeddings,
        [_Block(layer) for layer in body.encoder.layer],
        nn.Identity(),
        model.cls,
        plan_suffixes=_BERT_PLAN,
    )


# --------------------------------------------------------------------------------------
# The task
# --------------------------------------------------------------------------------------


class HFTask:
    """``hf:<arch>[-<size>]`` as a training task over the built-in text (see the module
    docstring); ``batch_size`` and ``context`` default to the size's."""

    def __init__(
        self, name: str, *, batch_size: int | None = None, context: int | None = None
    ) -> None:
        try:
            self.arch, self.size = parse_hf_name(name)
        except ValueError as exc:
            raise TaskError(str(exc)) from None
        _transformers()
        self.name = f"hf:{self.arch}-{self.size}"
        spec = SIZES[self.arch]
        size = spec.sizes[self.size]
        self.masked = spec.masked
        self.batch_size = size.batch_size if batch_size is None else batch_size
        self.context = size.context if context is None else context
        self.learning_rate = size.learning_rate
        self.layers = int(size.config[spec.layers_field])
        self.width = int(size.config[spec.width_field])

    @property
    def seq_len(self) -> int:
        return self.context

    def build_model(self) -> nn.Module:
        return build_hf_model(self.arch, self.size)

    def tp_plan(self) -> dict[str, str]:
        with torch.device("meta"):
            model = self.build_model()
        assert isinstance(model, HFTransformer)
        return model.tp_plan()

    def batches(
        self, rank: int, world_size: int, seed: int, *, shares: Sequence[float] | None = None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        part = _shard(self.batch_size, rank, world_size, shares)
        if self.masked:
            return masked_byte_batches(self.batch_size, self.context, 0.15, part, seed)
        return next_byte_batches(self.batch_size, self.context, part, seed)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        inputs, targets = batch
        logits = model(inputs)
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE
        )
