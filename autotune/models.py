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

__all__ = ["MODEL_CATALOG", "transformer"]


def transformer(
    name: str, *, hidden: int, layers: int, heads: int, seq_len: int, vocab: int = 50_257
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
    )


_PROFILES: Final = (
    transformer("gpt-125m", hidden=768, layers=12, heads=12, seq_len=1024),
    transformer("gpt-350m", hidden=1024, layers=24, heads=16, seq_len=1024),
    transformer("gpt-1.3b", hidden=2048, layers=24, heads=16, seq_len=2048),
    transformer("gpt-7b", hidden=4096, layers=32, heads=32, seq_len=2048, vocab=32_000),
    transformer("bert-large", hidden=1024, layers=24, heads=16, seq_len=512, vocab=30_522),
    ModelProfile(
        name="resnet-50",
        parameters=25_557_032,
        flops_per_sample=3 * 4.1e9,
        activation_bytes_per_sample=54e6,
        num_layers=16,
    ),
)

MODEL_CATALOG: Final[MappingProxyType[str, ModelProfile]] = MappingProxyType(
    {p.name: p for p in _PROFILES}
)
