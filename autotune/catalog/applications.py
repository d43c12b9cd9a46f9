"""The six applications whose profiles and coefficients come from measurements.

Pollux (Qiao et al., OSDI'21) measured six training jobs on 16 AWS g4dn.12xlarge nodes
(4 NVIDIA T4 each) and published their step and synchronisation times and the
statistical efficiency of each batch size (Apache-2.0; ``shared/data/pollux``). The
catalog carries them as models like any other, with what those measurements give:

- the ``ModelProfile`` of each (``application_profile``): parameters and FLOPs from its
  architecture (below, with sources), the reference batch M0 (the smallest validated
  batch), the gradient noise scale phi (M0 * median(grad_var / grad_sqr) over that run),
  the largest local batch measured on a 16 GB T4;
- the performance model's coefficients fitted on every measured placement
  (``coefficients``; ``catalog_coefficients`` for any model: these for the six, the
  literature defaults for the rest), and the samples each trains to its target
  (``target_samples``).

The shipped ``data/applications.json`` holds the measured values and the fitted
coefficients, so simulations run without the traces; the Pollux study
(``autotune.studies.pollux``) reads the traces, validates the fit and regenerates it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any, Final

from autotune.core import ModelProfile
from autotune.perf.model import DEFAULT_COEFFICIENTS, Coefficients

__all__ = [
    "APPLICATIONS",
    "APPLICATION_PROFILES",
    "application_profile",
    "catalog_coefficients",
    "coefficients",
    "max_local_batch",
    "register_coefficients",
    "target_samples",
]

APPLICATIONS: Final = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")

# Architecture figures (parameters; training FLOPs per sample = 3 x forward):
# bert: BERT-base fine-tuned on SQuAD, 110 M parameters, sequences of 384 tokens:
#   6 x 110e6 x 384 FLOPs (Devlin et al. 2019; Kaplan et al. 2020).
# cifar10: ResNet-18 for 32x32 inputs, 11.2 M parameters, 0.56 GFLOPs forward.
# deepspeech2: DeepSpeech2 (Amodei et al. 2016) as in AdaptDL's example, about 38 M
#   parameters; assumed 20 GFLOPs forward per utterance (GRU layers over ~400 frames).
# imagenet: ResNet-50, 25.6 M parameters, 4.1 GFLOPs forward (He et al. 2016).
# ncf: NeuMF on MovieLens (He et al. 2017), assumed 15 M parameters (embeddings),
#   0.1 MFLOPs forward per sample (a 4-layer MLP).
# yolov3: YOLOv3 at 416x416, 61.9 M parameters, 65.9 GFLOPs forward (Redmon & Farhadi
#   2018).
# Activation bytes per sample (16-bit) are assumed from the architectures' layer outputs;
# they only bound the local batch on a 16 GB T4, which the measurements already do.
_ARCH: Final[dict[str, dict[str, Any]]] = {
    "bert": {
        "parameters": 110_000_000,
        "flops": 6 * 110e6 * 384,
        "act": 350e6,
        "layers": 12,
        "hidden": 768,
        "seq": 384,
    },
    "cifar10": {
        "parameters": 11_200_000,
        "flops": 3 * 0.56e9,
        "act": 5e6,
        "layers": 8,
        "hidden": 0,
        "seq": 1,
    },
    "deepspeech2": {
        "parameters": 38_000_000,
        "flops": 3 * 20e9,
        "act": 200e6,
        "layers": 7,
        "hidden": 0,
        "seq": 1,
    },
    "imagenet": {
        "parameters": 25_557_032,
        "flops": 3 * 4.1e9,
        "act": 54e6,
        "layers": 16,
        "hidden": 0,
        "seq": 1,
    },
    "ncf": {
        "parameters": 15_000_000,
        "flops": 3 * 0.1e6,
        "act": 0.1e6,
        "layers": 4,
        "hidden": 0,
        "seq": 1,
    },
    "yolov3": {
        "parameters": 61_949_149,
        "flops": 3 * 65.9e9,
        "act": 400e6,
        "layers": 75,
        "hidden": 0,
        "seq": 1,
    },
}


def application_profile(
    app: str, reference_batch: int, noise_scale: float, max_local: int | None = None
) -> ModelProfile:
    """The profile of ``app`` from its architecture and its measured reference batch,
    noise scale and (where known) largest local batch on a 16 GB T4."""
    arch = _ARCH[app]
    activations = float(arch["act"])
    if max_local:
        # The measurements ran up to ``max_local`` samples per T4 in fp32: activations
        # can take at most what the 16 GiB left after weights, gradients, Adam's moments
        # and 1 GiB of runtime (``memory.rank_memory``), in 16-bit units as profiles count.
        free = 16 * (1 << 30) - arch["parameters"] * 16 - (1 << 30)
        activations = min(activations, free / max_local / 2)
    return ModelProfile(
        name=app,
        parameters=arch["parameters"],
        flops_per_sample=arch["flops"],
        activation_bytes_per_sample=activations,
        num_layers=arch["layers"],
        hidden_size=arch["hidden"],
        seq_len=arch["seq"],
        reference_batch=reference_batch,
        noise_scale=noise_scale,
    )


@cache
def _shipped() -> dict[str, Any]:
    text = resources.files("autotune").joinpath("data/applications.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def _load_profiles() -> MappingProxyType[str, ModelProfile]:
    apps = _shipped()["apps"]
    return MappingProxyType(
        {
            app: application_profile(
                app,
                int(apps[app]["reference_batch"]),
                float(apps[app]["noise_scale"]),
                int(apps[app]["max_local_batch"]),
            )
            for app in APPLICATIONS
        }
    )


APPLICATION_PROFILES: Final = _load_profiles()
"""The six applications' profiles, by name."""


def coefficients(app: str) -> Coefficients:
    """The shipped coefficients of ``app``, fitted on all its measured placements."""
    return Coefficients(**_shipped()["apps"][app]["coefficients"])


def target_samples(app: str) -> float:
    """Samples at the reference batch (statistical efficiency 1) to finish training."""
    return float(_shipped()["apps"][app]["target_samples"])


def max_local_batch(app: str) -> int:
    """The largest per-GPU batch measured on a T4 (what fits its memory)."""
    return int(_shipped()["apps"][app]["max_local_batch"])


_CALIBRATED: dict[str, Coefficients] = {}
"""Coefficients of calibrated devices, by device name."""

_CALIBRATED_TASKS: dict[tuple[str, str], Coefficients] = {}
"""A calibrated device's coefficients with a task's own compute fitted, by device name
and task (``autotune calibrate --cluster-file --compute TASK``)."""


def register_coefficients(
    gpu_model: str, coeffs: Coefficients, tasks: Mapping[str, Coefficients] | None = None
) -> None:
    """The coefficients measured on a calibrated device (``autotune calibrate
    --cluster-file``; ``autotune.catalog.clusters.register_calibration``), and those of
    the ``tasks`` whose own compute the calibration fitted; they replace what an earlier
    calibration of the device registered."""
    _CALIBRATED[gpu_model] = coeffs
    for key in [k for k in _CALIBRATED_TASKS if k[0] == gpu_model]:
        del _CALIBRATED_TASKS[key]
    for task, task_coeffs in (tasks or {}).items():
        _CALIBRATED_TASKS[(gpu_model, task)] = task_coeffs


def catalog_coefficients(model: ModelProfile, gpu_model: str | None = None) -> Coefficients:
    """The coefficients a job's predictions start from: on a calibrated device
    (``gpu_model``), the calibration's, with the model's own compute where the
    calibration fitted it; else fitted to its measurements for the six applications,
    the literature defaults for every other model."""
    if gpu_model is not None:
        calibrated = _CALIBRATED_TASKS.get((gpu_model, model.name), _CALIBRATED.get(gpu_model))
        if calibrated is not None:
            return calibrated
    return coefficients(model.name) if model.name in APPLICATIONS else DEFAULT_COEFFICIENTS
