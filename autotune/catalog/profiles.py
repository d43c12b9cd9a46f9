"""Built-in model profiles, derived from the architectures' shapes.

Transformers (hidden h, layers L, heads a, sequence s, vocabulary V):
- parameters = 12*L*h^2 + 2*V*h (untied embedding and head; biases and norms omitted)
- training FLOPs per sample = 6 * parameters * s (Kaplan et al. 2020; attention's
  s^2 term is omitted, under 10% at these shapes)
- activation bytes per sample = L * s * h * (34 + 5*a*s/h), 16-bit, no recomputation
  (Korthikanti et al. 2022, eq. 1 with b = 1, t = 1)

ResNet-50: 25.6 M parameters and 4.1 GFLOPs per 224x224 forward (He et al. 2016), so
12.3 GFLOPs per training sample (backward = 2 x forward). Activations: its conv layers
output about 9.1 M values per 224x224 image (stem 0.8 M, stages 3.6 + 2.4 + 1.8 + 0.45 M);
each is kept for the backward of its conv, batch-norm and ReLU, so about 27 M values,
54 MB in 16-bit.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

from autotune.core import ModelProfile
from autotune.perf.pollux import POLLUX_APPS

__all__ = ["MODEL_CATALOG", "transformer"]


def transformer(
    name: str,
    *,
    hidden: int,
    layers: int,
    heads: int,
    seq_len: int,
    vocab: int = 50_257,
    reference_batch: int = 32,
    noise_scale: float = 0.0,
    precision_sensitivity: float = 0.0,
) -> ModelProfile:
    parameters = 12 * layers * hidden**2 + 2 * vocab * hidden
    return ModelProfile(
        name=name,
        parameters=parameters,
        flops_per_sample=6.0 * parameters * seq_len,
        activation_bytes_per_sample=float(
            layers * seq_len * hidden * (34 + 5 * heads * seq_len / hidden)
        ),
        num_layers=layers,
        hidden_size=hidden,
        seq_len=seq_len,
        reference_batch=reference_batch,
        noise_scale=noise_scale,
        precision_sensitivity=precision_sensitivity,
    )


# Gradient noise scales (samples) where no measurement ships: McCandlish et al. 2018
# (fig. 4) put GPT-2-class language models' critical batch at a few hundred sequences
# early in training, ImageNet ResNets at a few thousand images. Larger models are more
# sensitive to low precision (loss spikes; Wortsman et al. 2023); the rates are assumed.
_LM_BATCH: Final = 32
_LM_NOISE: Final = 512.0
_PROFILES: Final = (
    transformer(
        "gpt-125m",
        hidden=768,
        layers=12,
        heads=12,
        seq_len=1024,
        reference_batch=_LM_BATCH,
        noise_scale=_LM_NOISE,
    ),
    transformer(
        "gpt-350m",
        hidden=1024,
        layers=24,
        heads=16,
        seq_len=1024,
        reference_batch=_LM_BATCH,
        noise_scale=_LM_NOISE,
    ),
    transformer(
        "gpt-1.3b",
        hidden=2048,
        layers=24,
        heads=16,
        seq_len=2048,
        precision_sensitivity=0.02,
        reference_batch=_LM_BATCH,
        noise_scale=_LM_NOISE,
    ),
    transformer(
        "gpt-7b",
        hidden=4096,
        layers=32,
        heads=32,
        seq_len=2048,
        vocab=32_000,
        precision_sensitivity=0.05,
        reference_batch=_LM_BATCH,
        noise_scale=_LM_NOISE,
    ),
    transformer(
        "gpt-13b",
        hidden=5120,
        layers=40,
        heads=40,
        seq_len=2048,
        vocab=32_000,
        precision_sensitivity=0.08,
        reference_batch=_LM_BATCH,
        noise_scale=_LM_NOISE,
    ),
    transformer(
        "gpt-30b",
        hidden=6656,
        layers=60,
        heads=52,
        seq_len=2048,
        vocab=32_000,
        precision_sensitivity=0.1,
        reference_batch=_LM_BATCH,
        noise_scale=_LM_NOISE,
    ),
    transformer(
        "gpt-70b",
        hidden=8192,
        layers=80,
        heads=64,
        seq_len=4096,
        vocab=32_000,
        precision_sensitivity=0.15,
        reference_batch=_LM_BATCH,
        noise_scale=_LM_NOISE,
    ),
    transformer(
        "bert-large",
        hidden=1024,
        layers=24,
        heads=16,
        seq_len=512,
        vocab=30_522,
        reference_batch=_LM_BATCH,
        noise_scale=_LM_NOISE,
    ),
    ModelProfile(
        name="resnet-50",
        parameters=25_557_032,
        flops_per_sample=3 * 4.1e9,
        activation_bytes_per_sample=54e6,
        num_layers=16,
        reference_batch=256,
        noise_scale=4096.0,
    ),
    # ResNet-152: 60.2 M parameters, 11.5 GFLOPs per forward (He et al. 2016, table 1);
    # activations scale with depth: about 2.1x ResNet-50's.
    ModelProfile(
        name="resnet-152",
        parameters=60_192_808,
        flops_per_sample=3 * 11.5e9,
        activation_bytes_per_sample=115e6,
        num_layers=50,
        reference_batch=256,
        noise_scale=4096.0,
    ),
)


MODEL_CATALOG: Final[MappingProxyType[str, ModelProfile]] = MappingProxyType(
    {p.name: p for p in (*_PROFILES, *POLLUX_APPS.values())}
)
