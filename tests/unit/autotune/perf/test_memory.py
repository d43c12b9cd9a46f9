"""The per-rank memory model against figures computed by hand."""

from __future__ import annotations

import pytest

from autotune.catalog.profiles import MODEL_CATALOG
from autotune.core import JobConfig, Layout, ModelProfile, PrecisionMap
from autotune.perf.memory import rank_memory

GIB = 1 << 30


def test_seven_billion_fp32_adam_needs_sixteen_bytes_per_parameter() -> None:
    model = MODEL_CATALOG["gpt-7b"]
    estimate = rank_memory(model, JobConfig(layout=Layout(world_size=1)), global_batch=1)
    # fp32 weights 4 + gradients 4 + Adam moments 8 = 16 bytes per parameter, no master.
    assert estimate.master_weights_bytes == 0
    per_param = estimate.weights_bytes + estimate.gradients_bytes + estimate.optimizer_bytes
    assert per_param / model.parameters == pytest.approx(16.0, rel=1e-3)
    assert not estimate.fits(80 * GIB)


def test_mixed_precision_adds_an_fp32_master_copy_and_tp_pp_shard_it() -> None:
    model = MODEL_CATALOG["gpt-7b"]
    bf16 = PrecisionMap.uniform("bf16")
    one = rank_memory(model, JobConfig(layout=Layout(world_size=1), precision=bf16), 1)
    # Everything but the fp32 norms (0.02% of parameters) is bf16.
    assert one.master_weights_bytes / model.parameters == pytest.approx(4.0, rel=1e-3)
    eight = rank_memory(
        model, JobConfig(layout=Layout(world_size=8, tp=4, pp=2), precision=bf16), 1
    )
    assert eight.weights_bytes == pytest.approx(one.weights_bytes / 8)
    assert eight.optimizer_bytes == pytest.approx(one.optimizer_bytes / 8)
    assert eight.fits(80 * GIB)


def test_activation_checkpointing_and_micro_batches_shrink_activations() -> None:
    model = ModelProfile(
        name="m",
        parameters=1000,
        flops_per_sample=1.0,
        activation_bytes_per_sample=34e6,
        num_layers=10,
    )
    plain = rank_memory(model, JobConfig(layout=Layout(world_size=1)), global_batch=8)
    # fp32 ffn doubles the 16-bit activation figure: 34 MB * 2 * 8 samples.
    assert plain.activations_bytes == pytest.approx(34e6 * 2 * 8)
    ckpt = rank_memory(
        model, JobConfig(layout=Layout(world_size=1, activation_checkpointing=True)), 8
    )
    # Keep 2/34 of every layer plus one layer recomputed in full.
    assert ckpt.activations_bytes == pytest.approx(34e6 * 2 * 8 * (2 / 34 + 1 / 10))
    accumulated = rank_memory(model, JobConfig(layout=Layout(world_size=1, micro_batches=4)), 8)
    assert accumulated.activations_bytes == pytest.approx(plain.activations_bytes / 4)


def test_a_fraction_of_a_gpu_gets_that_fraction_of_its_memory() -> None:
    estimate = rank_memory(MODEL_CATALOG["resnet-50"], JobConfig(layout=Layout(world_size=1)), 32)
    assert estimate.fits(16 * GIB, gpu_milli=1000)
    assert not estimate.fits(16 * GIB, gpu_milli=100)
