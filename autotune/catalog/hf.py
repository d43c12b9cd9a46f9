"""Hugging Face ``transformers`` models by name: ``hf:<architecture>[-<size>]``.

The names, the configurations behind them and their profiles, as data: nothing here
imports torch or ``transformers``; ``autotune.executor.hf`` builds the models from the
same configurations. ``hf:gpt2`` is GPT-2 small, ``hf:llama`` Llama 3.2 1B's shape,
``hf:bert`` BERT-base; ``-tiny`` is a two-block model of each, for tests and smoke runs.

A profile (``hf_profile``) is counted from the configuration with the catalog's own
transformer formulas (``autotune.catalog.profiles.transformer_profile``), for the model
the executor builds (untied head, GPT-2's projections as linear layers): parameters
exactly, and the weights of every matmul counted from the architecture.
``tests/unit/executor/test_hf_tasks.py`` checks every size against the built model and
``torch.utils.flop_counter``.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Any, Final

from autotune.catalog.profiles import transformer_profile
from autotune.core import ModelProfile
from autotune.errors import InputError

__all__ = [
    "EXTRA_HINT",
    "HF_PREFIX",
    "SIZES",
    "HFArchitecture",
    "HFSize",
    "hf_installed",
    "hf_profile",
    "parse_hf_name",
]

HF_PREFIX: Final = "hf:"
EXTRA_HINT: Final = "pip install 'autotune[hf]'"


@dataclass(frozen=True, slots=True)
class HFSize:
    """One size of an architecture: its configuration's fields and how it trains."""

    config: Mapping[str, Any]
    context: int
    batch_size: int
    learning_rate: float
    source: str
    """What the size stands for, for people."""


@dataclass(frozen=True, slots=True)
class HFArchitecture:
    config_class: str
    model_class: str
    masked: bool
    """Trained as a masked LM (BERT) instead of predicting the next byte."""
    layers_field: str
    width_field: str
    default_size: str
    sizes: Mapping[str, HFSize] = field(default_factory=dict)


def _tiny(**config: Any) -> HFSize:
    return HFSize(config, 64, 16, 3e-3, "two blocks, width 64: for tests and smoke runs")


SIZES: Final[MappingProxyType[str, HFArchitecture]] = MappingProxyType(
    {
        "gpt2": HFArchitecture(
            "GPT2Config",
            "GPT2LMHeadModel",
            masked=False,
            layers_field="n_layer",
            width_field="n_embd",
            default_size="small",
            sizes={
                "tiny": _tiny(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64),
                **{
                    name: HFSize(
                        {"n_embd": width, "n_layer": layers, "n_head": heads},
                        1024,
                        32,
                        2.5e-4,
                        f"GPT-2 {name} (Radford et al. 2019), untied",
                    )
                    for name, (width, layers, heads) in {
                        "small": (768, 12, 12),
                        "medium": (1024, 24, 16),
                        "large": (1280, 36, 20),
                    }.items()
                },
            },
        ),
        "llama": HFArchitecture(
            "LlamaConfig",
            "LlamaForCausalLM",
            masked=False,
            layers_field="num_hidden_layers",
            width_field="hidden_size",
            default_size="1b",
            sizes={
                "tiny": _tiny(
                    vocab_size=256,
                    hidden_size=64,
                    intermediate_size=176,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    num_key_value_heads=2,
                    max_position_embeddings=64,
                ),
                "1b": HFSize(
                    {
                        "vocab_size": 128_256,
                        "hidden_size": 2048,
                        "intermediate_size": 8192,
                        "num_hidden_layers": 16,
                        "num_attention_heads": 32,
                        "num_key_value_heads": 8,
                        "max_position_embeddings": 2048,
                        "rope_theta": 500_000.0,
                    },
                    2048,
                    32,
                    3e-4,
                    "Llama 3.2 1B's shape, untied",
                ),
                "7b": HFSize(
                    {
                        "vocab_size": 32_000,
                        "hidden_size": 4096,
                        "intermediate_size": 11_008,
                        "num_hidden_layers": 32,
                        "num_attention_heads": 32,
                        "num_key_value_heads": 32,
                        "max_position_embeddings": 2048,
                    },
                    2048,
                    32,
                    3e-4,
                    "Llama 2 7B's shape",
                ),
            },
        ),
        "bert": HFArchitecture(
            "BertConfig",
            "BertForMaskedLM",
            masked=True,
            layers_field="num_hidden_layers",
            width_field="hidden_size",
            default_size="base",
            sizes={
                "tiny": _tiny(
                    vocab_size=260,  # bytes and BERT's mask (id 256)
                    hidden_size=64,
                    intermediate_size=256,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    max_position_embeddings=64,
                ),
                **{
                    name: HFSize(
                        {
                            "hidden_size": width,
                            "intermediate_size": 4 * width,
                            "num_hidden_layers": layers,
                            "num_attention_heads": heads,
                        },
                        512,
                        32,
                        1e-4,
                        f"BERT-{name} (Devlin et al. 2019), untied",
                    )
                    for name, (width, layers, heads) in {
                        "base": (768, 12, 12),
                        "large": (1024, 24, 16),
                    }.items()
                },
            },
        ),
    }
)

_NAME = re.compile(r"^hf:(?P<arch>[a-z0-9]+)(?:-(?P<size>[a-z0-9]+))?$")


def parse_hf_name(name: str) -> tuple[str, str]:
    """``(architecture, size)`` of ``hf:<architecture>[-<size>]``; ``TaskError`` naming
    what exists when it is not one of ``SIZES``."""
    match = _NAME.match(name)
    known = ", ".join(f"hf:{arch}[-{'|'.join(a.sizes)}]" for arch, a in SIZES.items())
    if match is None or match.group("arch") not in SIZES:
        raise InputError(f"task {name!r}: not a Hugging Face task this executor builds ({known})")
    arch = SIZES[match.group("arch")]
    size = match.group("size") or arch.default_size
    if size not in arch.sizes:
        raise InputError(
            f"task {name!r}: no size {size!r} of {match.group('arch')} "
            f"(sizes: {', '.join(arch.sizes)})"
        )
    return match.group("arch"), size


def hf_installed() -> bool:
    """Whether ``transformers`` can be imported here (without importing it)."""
    return importlib.util.find_spec("transformers") is not None


# The configuration fields the sizes leave at transformers' defaults.
_DEFAULTS: Final = {
    "gpt2": {"vocab_size": 50_257, "n_positions": 1024},
    "llama": {"vocab_size": 32_000},
    "bert": {"vocab_size": 30_522, "max_position_embeddings": 512, "type_vocab_size": 2},
}


def _counts(arch: str, c: Mapping[str, Any]) -> tuple[int, int, int]:
    """(parameters, weights of every matmul, vocabulary) of the model the executor builds
    from configuration ``c``."""
    v = int(c["vocab_size"])
    if arch == "gpt2":
        h, layers = int(c["n_embd"]), int(c["n_layer"])
        block_matmul = 12 * h * h  # q/k/v (fused), out, the 4h MLP pair
        block = block_matmul + 3 * h + h + 4 * h + h + 4 * h  # biases, two LayerNorms
        parameters = v * h + int(c["n_positions"]) * h + layers * block + 2 * h + v * h
        return parameters, layers * block_matmul + v * h, v
    if arch == "llama":
        h, layers = int(c["hidden_size"]), int(c["num_hidden_layers"])
        heads = int(c["num_attention_heads"])
        kv = int(c.get("num_key_value_heads", heads))
        inner, d = int(c["intermediate_size"]), h // heads
        block_matmul = 2 * h * heads * d + 2 * h * kv * d + 3 * h * inner  # no biases
        parameters = v * h + layers * (block_matmul + 2 * h) + h + v * h
        return parameters, layers * block_matmul + v * h, v
    h, layers, inner = (
        int(c["hidden_size"]),
        int(c["num_hidden_layers"]),
        int(c["intermediate_size"]),
    )
    block_matmul = 4 * h * h + 2 * h * inner
    block = block_matmul + 4 * h + inner + h + 4 * h  # biases, two LayerNorms
    embeddings = (v + int(c["max_position_embeddings"]) + int(c["type_vocab_size"])) * h + 2 * h
    # The MLM head: an h x h transform and its LayerNorm, the decoder and two biases of
    # the vocabulary (the decoder's and the head's own, untied).
    head = h * h + h + 2 * h + v * h + 2 * v
    return embeddings + layers * block + head, layers * block_matmul + h * h + v * h, v


@cache
def hf_profile(name: str) -> ModelProfile:
    """The profile of ``hf:<arch>[-<size>]`` (see the module docstring)."""
    arch, size_name = parse_hf_name(name)
    spec = SIZES[arch]
    size = spec.sizes[size_name]
    config = {**_DEFAULTS[arch], **size.config}
    parameters, matmul, vocab = _counts(arch, config)
    return transformer_profile(
        f"hf:{arch}-{size_name}",
        parameters=parameters,
        vocab=vocab,
        context=size.context,
        layers=int(config[spec.layers_field]),
        width=int(config[spec.width_field]),
        batch_size=size.batch_size,
        matmul_parameters=matmul,
    )
