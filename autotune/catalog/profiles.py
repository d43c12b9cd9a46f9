"""Built-in model profiles, counted from the shapes the executor builds its models from.

Each architecture model of the catalog is a shape config (``GPTConfig``, ``BERTConfig``,
``ResNetConfig``, in ``MODEL_SHAPES``); its ``ModelProfile`` is counted from that config
here, and the executor's model (``autotune.executor.tasks``) is built from the same
config, so the parameters the Planner and the simulator plan for are the parameters the
executor trains (``tests/unit/executor/test_model_tasks.py`` checks every one).

Transformers (width h, layers L, context s, vocabulary V), the executor's layout:
learned token and position embeddings, pre-norm blocks with separate q/k/v/out
projections and a 4h feed-forward pair, all with biases, a final LayerNorm and an untied
head (BERT adds the MLM head's h x h transform and LayerNorm, and a bias on the head):

- parameters: counted exactly from that layout (``gpt_parameters``, ``bert_parameters``)
- training FLOPs per sample: 6 x (parameters - embedding tables) x s, plus attention's
  12 x L x s^2 x h (Kaplan et al. 2020; PaLM, Chowdhery et al. 2022, appendix B). The
  embedding tables are lookups, not matmuls.
- activation bytes per sample, in 16-bit units (``ModelProfile``'s convention; the memory
  model scales them to the precision the feed-forward runs in): Korthikanti et al.
  2022's 34 x s x h per block, without their 5 x a x s^2 attention-score term because
  the executor's attention is ``scaled_dot_product_attention``, whose fused kernels keep
  no s x s scores; plus the 4 x s x V bytes of the fp32 log-softmax that the loss keeps
  for its backward.

The GPTs train on bytes (ids 0-255) yet keep their published vocabularies (GPT-2's
50,257; 32,000 for the 7B-70B entries; BERT's 30,522), so their embedding and head cost
what the published models' do. The ids above 255 are never inputs; the head learns to
give them no probability.

ResNets (He et al. 2016; torchvision's v1.5 layout, the stride in the 3x3 convolution):
parameters counted from the convolutions, batch norms and classifier; training FLOPs per
sample = 3 x forward, forward = 2 x the multiply-adds of every convolution and the
classifier (He et al.'s table 1 "FLOPs" are multiply-adds: 3.8-4.1 G for ResNet-50 is
7.7-8.2 GFLOPs); activation bytes = every convolution's output kept twice (the batch
norm's input and the ReLU's output, or the residual sum's) at 2 bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from autotune.catalog.applications import APPLICATION_PROFILES
from autotune.core import ModelProfile

__all__ = [
    "MODEL_CATALOG",
    "MODEL_SHAPES",
    "BERTConfig",
    "GPTConfig",
    "ModelShape",
    "ResNetConfig",
    "bert_parameters",
    "bert_profile",
    "gpt_parameters",
    "gpt_profile",
    "profile_of",
    "resnet_forward_macs",
    "resnet_parameters",
    "resnet_profile",
    "transformer_profile",
]


# --------------------------------------------------------------------------------------
# Shapes
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GPTConfig:
    """A decoder's shape (``autotune.executor.tasks.GPT``): nanoGPT's layout with
    separate q/k/v/out projections, biases, pre-norm blocks and an untied head. The
    defaults are ``gpt-char``'s."""

    vocab: int = 256  # bytes
    context: int = 64  # tokens of context
    layers: int = 4
    width: int = 128
    heads: int = 4
    batch_size: int = 16  # global batch per step; the profile's reference batch
    learning_rate: float = 3e-3  # Adam's, constant


@dataclass(frozen=True, slots=True)
class BERTConfig:
    """An encoder's shape (``autotune.executor.tasks.BERT``): the GPT layout with
    bidirectional attention, and BERT's masked-LM head (h x h transform, GELU,
    LayerNorm, then the untied vocabulary projection with a bias)."""

    vocab: int = 30_522
    context: int = 512
    layers: int = 24
    width: int = 1024
    heads: int = 16
    batch_size: int = 32
    learning_rate: float = 1e-4  # Devlin et al. 2019
    mask_rate: float = 0.15  # share of positions masked and predicted


@dataclass(frozen=True, slots=True)
class ResNetConfig:
    """A bottleneck ResNet's shape (``autotune.executor.tasks.ResNet``): a 7x7 stem of
    ``width`` channels and a 3x3 max-pool, then stages of ``blocks[i]`` bottlenecks of
    inner width ``width * 2**i`` (output 4x that), each stage after the first halving the
    resolution in its first block's 3x3 convolution; global average pool, classifier."""

    blocks: tuple[int, ...] = (3, 4, 6, 3)
    width: int = 64
    classes: int = 1000
    image: int = 224  # pixels per side, 3 channels
    batch_size: int = 256
    learning_rate: float = 1e-3  # Adam's, constant


ModelShape = GPTConfig | BERTConfig | ResNetConfig


# --------------------------------------------------------------------------------------
# Counting
# --------------------------------------------------------------------------------------


def _block_parameters(width: int) -> int:
    """One transformer block: q/k/v/out projections with biases, the 4x feed-forward pair
    with biases, two LayerNorms."""
    h = width
    return 4 * (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h) + 2 * 2 * h


def gpt_parameters(c: GPTConfig) -> int:
    return (
        c.vocab * c.width  # token embedding
        + c.context * c.width  # position embedding
        + c.layers * _block_parameters(c.width)
        + 2 * c.width  # final LayerNorm
        + c.width * c.vocab  # head, no bias
    )


def bert_parameters(c: BERTConfig) -> int:
    h = c.width
    return (
        c.vocab * h
        + c.context * h
        + c.layers * _block_parameters(h)
        + 2 * h  # final LayerNorm
        + (h * h + h)
        + 2 * h  # MLM transform and its LayerNorm
        + (h * c.vocab + c.vocab)  # head, with bias
    )


def transformer_profile(
    name: str,
    *,
    parameters: int,
    vocab: int,
    context: int,
    layers: int,
    width: int,
    batch_size: int,
    noise_scale: float = 0.0,
    precision_sensitivity: float = 0.0,
    matmul_parameters: int | None = None,
) -> ModelProfile:
    """A transformer's profile by the formulas of the module docstring.
    ``matmul_parameters``: the weights of every matmul, where they are not the parameters
    less the token and position embeddings (a head tied to the embedding, no position
    table: ``autotune.catalog.hf``)."""
    if matmul_parameters is None:
        matmul_parameters = parameters - (vocab + context) * width  # embeddings are lookups
    flops = 6 * matmul_parameters * context + 12 * layers * context**2 * width
    activations = 34 * context * width * layers + 4 * context * vocab
    return ModelProfile(
        name=name,
        parameters=parameters,
        flops_per_sample=float(flops),
        activation_bytes_per_sample=float(activations),
        num_layers=layers,
        hidden_size=width,
        seq_len=context,
        reference_batch=batch_size,
        noise_scale=noise_scale,
        precision_sensitivity=precision_sensitivity,
    )


def gpt_profile(
    name: str, c: GPTConfig, *, noise_scale: float = 0.0, precision_sensitivity: float = 0.0
) -> ModelProfile:
    """The profile of the decoder ``c`` describes (see the module docstring)."""
    return transformer_profile(
        name,
        parameters=gpt_parameters(c),
        vocab=c.vocab,
        context=c.context,
        layers=c.layers,
        width=c.width,
        batch_size=c.batch_size,
        noise_scale=noise_scale,
        precision_sensitivity=precision_sensitivity,
    )


def bert_profile(
    name: str, c: BERTConfig, *, noise_scale: float = 0.0, precision_sensitivity: float = 0.0
) -> ModelProfile:
    """The profile of the encoder ``c`` describes (see the module docstring)."""
    return transformer_profile(
        name,
        parameters=bert_parameters(c),
        vocab=c.vocab,
        context=c.context,
        layers=c.layers,
        width=c.width,
        batch_size=c.batch_size,
        noise_scale=noise_scale,
        precision_sensitivity=precision_sensitivity,
    )


def _resnet_convs(c: ResNetConfig) -> list[tuple[int, int, int, int]]:
    """Every convolution as (kernel, in channels, out channels, output side)."""
    side = (c.image + 2 * 3 - 7) // 2 + 1  # 7x7 stride 2, padding 3
    convs = [(7, 3, c.width, side)]
    side = (side + 2 - 3) // 2 + 1  # 3x3 max-pool, stride 2, padding 1
    channels = c.width
    for stage, count in enumerate(c.blocks):
        inner = c.width << stage
        for index in range(count):
            stride = 2 if stage > 0 and index == 0 else 1
            out_side = (side + 2 - 3) // stride + 1
            convs += [(1, channels, inner, side), (3, inner, inner, out_side)]
            convs.append((1, inner, 4 * inner, out_side))
            if index == 0:  # the projection shortcut
                convs.append((1, channels, 4 * inner, out_side))
            channels, side = 4 * inner, out_side
    return convs


def resnet_parameters(c: ResNetConfig) -> int:
    """Convolutions (no biases), a batch norm (scale and shift) after each, classifier."""
    convs = _resnet_convs(c)
    weights = sum(k * k * cin * cout for k, cin, cout, _ in convs)
    norms = sum(2 * cout for _, _, cout, _ in convs)
    features = 4 * c.width << (len(c.blocks) - 1)
    return weights + norms + features * c.classes + c.classes


def resnet_forward_macs(c: ResNetConfig) -> int:
    """Multiply-adds of one image's forward pass: convolutions and classifier."""
    features = 4 * c.width << (len(c.blocks) - 1)
    convs = sum(k * k * cin * cout * side * side for k, cin, cout, side in _resnet_convs(c))
    return convs + features * c.classes


def resnet_profile(name: str, c: ResNetConfig, *, noise_scale: float = 0.0) -> ModelProfile:
    """The profile of the ResNet ``c`` describes (see the module docstring)."""
    values = sum(cout * side * side for _, _, cout, side in _resnet_convs(c))
    return ModelProfile(
        name=name,
        parameters=resnet_parameters(c),
        flops_per_sample=float(3 * 2 * resnet_forward_macs(c)),
        activation_bytes_per_sample=float(2 * values * 2),
        num_layers=sum(c.blocks),  # bottleneck blocks: the pipeline's grain
        reference_batch=c.batch_size,
        noise_scale=noise_scale,
    )


def profile_of(name: str, shape: ModelShape, **statistics: float) -> ModelProfile:
    """``name``'s profile counted from ``shape``; ``statistics``: ``noise_scale`` and, for
    transformers, ``precision_sensitivity``."""
    if isinstance(shape, GPTConfig):
        return gpt_profile(name, shape, **statistics)
    if isinstance(shape, BERTConfig):
        return bert_profile(name, shape, **statistics)
    return resnet_profile(name, shape, **statistics)


# --------------------------------------------------------------------------------------
# The catalog
# --------------------------------------------------------------------------------------

# GPT-3's shapes (Brown et al. 2020, table 2.1: Small, Medium, XL; their learning rates),
# GPT-2's vocabulary; the 7B-70B entries are LLaMA's shapes (Touvron et al. 2023) in this
# layout. BERT-large (Devlin et al. 2019). ResNet-50 and -152 (He et al. 2016, table 1).
MODEL_SHAPES: Final[Mapping[str, ModelShape]] = MappingProxyType(
    {
        "gpt-125m": GPTConfig(
            vocab=50_257,
            context=1024,
            layers=12,
            width=768,
            heads=12,
            batch_size=32,
            learning_rate=6e-4,
        ),
        "gpt-350m": GPTConfig(
            vocab=50_257,
            context=1024,
            layers=24,
            width=1024,
            heads=16,
            batch_size=32,
            learning_rate=3e-4,
        ),
        "gpt-1.3b": GPTConfig(
            vocab=50_257,
            context=2048,
            layers=24,
            width=2048,
            heads=16,
            batch_size=32,
            learning_rate=2e-4,
        ),
        "gpt-7b": GPTConfig(
            vocab=32_000,
            context=2048,
            layers=32,
            width=4096,
            heads=32,
            batch_size=32,
            learning_rate=3e-4,
        ),
        "gpt-13b": GPTConfig(
            vocab=32_000,
            context=2048,
            layers=40,
            width=5120,
            heads=40,
            batch_size=32,
            learning_rate=3e-4,
        ),
        "gpt-30b": GPTConfig(
            vocab=32_000,
            context=2048,
            layers=60,
            width=6656,
            heads=52,
            batch_size=32,
            learning_rate=1.5e-4,
        ),
        "gpt-70b": GPTConfig(
            vocab=32_000,
            context=4096,
            layers=80,
            width=8192,
            heads=64,
            batch_size=32,
            learning_rate=1.5e-4,
        ),
        "bert-large": BERTConfig(),
        "resnet-50": ResNetConfig(blocks=(3, 4, 6, 3)),
        "resnet-152": ResNetConfig(blocks=(3, 8, 36, 3)),
    }
)

# Gradient noise scales (samples) where no measurement ships: McCandlish et al. 2018
# (fig. 4) put GPT-2-class language models' critical batch at a few hundred sequences
# early in training, ImageNet ResNets at a few thousand images. Larger models are more
# sensitive to low precision (loss spikes; Wortsman et al. 2023); the rates are assumed.
_LM_NOISE: Final = 512.0
_IMAGE_NOISE: Final = 4096.0
_STATISTICS: Final[Mapping[str, dict[str, float]]] = {
    "gpt-125m": {"noise_scale": _LM_NOISE},
    "gpt-350m": {"noise_scale": _LM_NOISE},
    "gpt-1.3b": {"noise_scale": _LM_NOISE, "precision_sensitivity": 0.02},
    "gpt-7b": {"noise_scale": _LM_NOISE, "precision_sensitivity": 0.05},
    "gpt-13b": {"noise_scale": _LM_NOISE, "precision_sensitivity": 0.08},
    "gpt-30b": {"noise_scale": _LM_NOISE, "precision_sensitivity": 0.1},
    "gpt-70b": {"noise_scale": _LM_NOISE, "precision_sensitivity": 0.15},
    "bert-large": {"noise_scale": _LM_NOISE},
    "resnet-50": {"noise_scale": _IMAGE_NOISE},
    "resnet-152": {"noise_scale": _IMAGE_NOISE},
}


MODEL_CATALOG: Final[MappingProxyType[str, ModelProfile]] = MappingProxyType(
    {
        **{
            name: profile_of(name, shape, **_STATISTICS[name])
            for name, shape in MODEL_SHAPES.items()
        },
        **APPLICATION_PROFILES,
    }
)
"""Every model the simulator knows: the architectures of ``MODEL_SHAPES`` and the
Pollux applications (profiles from Pollux's measurements, ``autotune.catalog.applications``)."""
