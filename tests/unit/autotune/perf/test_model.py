"""The performance model: each term against its formula, and its monotonic behaviour."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import SHARED_DATA

from autotune.catalog.profiles import MODEL_CATALOG
from autotune.core import CompressionSpec, JobConfig, Layout, PrecisionMap
from autotune.perf.model import (
    Coefficients,
    Shape,
    StepTime,
    batch_efficiency,
    batch_gain,
    compression_efficiency,
    estimate,
    expected_max_normal,
    ring_allreduce_s,
    step_time,
)
from autotune.perf.stragglers import derive, job_cvs

GPT = MODEL_CATALOG["gpt-350m"]


def _config(world: int, *, compression: CompressionSpec | None = None, **layout: int) -> JobConfig:
    return JobConfig(
        layout=Layout(world_size=world, **layout),
        precision=PrecisionMap.uniform("bf16"),
        compression=compression or CompressionSpec(),
    )


def test_ring_allreduce_matches_the_alpha_beta_formula() -> None:
    # 8 ranks, 1 GB at 10 GB/s, alpha 1 ms: 14 * 1 ms + 2 * 7/8 * 0.1 s
    assert ring_allreduce_s(1e9, 8, latency_s=1e-3, bandwidth_gbps=10) == pytest.approx(
        0.014 + 0.175
    )
    assert ring_allreduce_s(1e9, 1, latency_s=1e-3, bandwidth_gbps=10) == 0.0


def test_expected_max_of_normals_grows_slowly() -> None:
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(0.564, abs=0.03)  # exact 1/sqrt(pi); Blom 0.589
    assert expected_max_normal(16) == pytest.approx(1.766, abs=0.03)


def test_single_gpu_step_is_compute_plus_overhead() -> None:
    coeffs = Coefficients(compute_overhead_s=0.0)
    step = step_time(
        GPT, _config(1), Shape(gpu_model="A100", ranks_per_node=(1,)), 8, coeffs=coeffs
    )
    expected = GPT.flops_per_sample * 8 / (312e12 * coeffs.mfu)
    assert step.sync_s == 0.0
    assert step.step_s == pytest.approx(expected, rel=1e-2)  # norms stay fp32


def test_crossing_nodes_and_sharing_a_nic_slow_synchronisation() -> None:
    config = _config(8)
    one_node = step_time(GPT, config, Shape(gpu_model="A100", ranks_per_node=(8,)), 64)
    two_nodes = step_time(GPT, config, Shape(gpu_model="A100", ranks_per_node=(4, 4)), 64)
    eight_nodes = step_time(GPT, config, Shape(gpu_model="A100", ranks_per_node=(1,) * 8), 64)
    assert one_node.sync_s < eight_nodes.sync_s < two_nodes.sync_s


def test_tree_latency_and_the_two_node_factor_apply_between_nodes_only() -> None:
    config = _config(8)
    base = Coefficients()
    tree = Coefficients(tree_latency_s=0.01)
    two = Coefficients(two_node_sync_factor=1.5)
    shapes = {
        "one": Shape(gpu_model="A100", ranks_per_node=(8,)),
        "two": Shape(gpu_model="A100", ranks_per_node=(4, 4)),
        "four": Shape(gpu_model="A100", ranks_per_node=(2, 2, 2, 2)),
    }

    def sync(shape: str, coeffs: Coefficients) -> float:
        return step_time(GPT, config, shapes[shape], 64, coeffs=coeffs).sync_s

    assert sync("one", tree) == sync("one", base)
    assert sync("one", two) == sync("one", base)
    # 8 ranks: 2 log2(8) = 6 tree steps.
    assert sync("four", tree) == pytest.approx(sync("four", base) + 0.06)
    assert sync("two", two) == pytest.approx(1.5 * sync("two", base))
    assert sync("four", two) == sync("four", base)


def test_the_busiest_node_bounds_the_inter_node_ring() -> None:
    config = _config(6)
    coeffs = Coefficients(node_sharing_exponent=1.0)
    even = step_time(GPT, config, Shape(gpu_model="A100", ranks_per_node=(3, 3)), 48, coeffs=coeffs)
    uneven = step_time(
        GPT, config, Shape(gpu_model="A100", ranks_per_node=(4, 2)), 48, coeffs=coeffs
    )
    assert uneven.sync_s > even.sync_s


def test_batch_exponent_bends_compute_in_the_local_batch() -> None:
    shape = Shape(gpu_model="A100", ranks_per_node=(1,))
    linear = Coefficients(compute_overhead_s=0.0)
    bent = Coefficients(compute_overhead_s=0.0, batch_exponent=1.5)

    def compute(batch: int, coeffs: Coefficients) -> float:
        return step_time(GPT, _config(1), shape, batch, coeffs=coeffs).compute_s

    assert compute(16, linear) / compute(4, linear) == pytest.approx(4.0)
    assert compute(16, bent) / compute(4, bent) == pytest.approx(4.0**1.5)
    with pytest.raises(ValueError, match="batch_exponent"):
        Coefficients(batch_exponent=0.0)


def test_compression_shrinks_bytes_sent() -> None:
    shape = Shape(gpu_model="V100M32", ranks_per_node=(1,) * 8)
    dense = step_time(GPT, _config(8), shape, 64)
    topk = step_time(
        GPT, _config(8, compression=CompressionSpec(kind="topk", ratio=0.01)), shape, 64
    )
    int8 = step_time(GPT, _config(8, compression=CompressionSpec(kind="int8")), shape, 64)
    assert topk.bytes_sent < int8.bytes_sent < dense.bytes_sent
    assert dense.bytes_sent == pytest.approx(dense.dense_bytes)
    assert topk.compress_s > 0
    assert topk.sync_s < dense.sync_s


def test_the_executors_reduction_sends_fp32_gathers_codes_and_does_not_overlap_them() -> None:
    shape = Shape(gpu_model="V100M32", ranks_per_node=(1,) * 4, inter_node_gbps=1.0)
    framework = Coefficients(overlap_gamma=2.0)
    executor = Coefficients(overlap_gamma=2.0, executor_reduction=True)

    def step(coeffs: Coefficients, kind: str = "none", **spec: float) -> StepTime:
        config = _config(4, compression=CompressionSpec(kind=kind, **spec))  # type: ignore[arg-type]
        return step_time(GPT, config, shape, 64, coeffs=coeffs)

    # Dense bf16: fp32 gradients in the executor, twice the 16-bit bytes.
    assert step(executor).bytes_sent == pytest.approx(2 * step(framework).bytes_sent)
    # int8 codes all-gathered: each of 4 ranks receives 3 whole codes, against a ring's
    # 2 * 3/4; dequantising them adds kernel time.
    int8_f, int8_e = step(framework, "int8"), step(executor, "int8")
    assert int8_e.bytes_sent == pytest.approx(2 * int8_f.bytes_sent)
    assert int8_e.compress_s > int8_f.compress_s
    # top-k: fp32 values and int64 indices (12 bytes an entry) against 16-bit and int32 (6).
    topk_f, topk_e = step(framework, "topk", ratio=0.01), step(executor, "topk", ratio=0.01)
    assert topk_e.bytes_sent == pytest.approx(2 * topk_f.bytes_sent, rel=1e-3)
    # Reduced after backward: the step is compute plus sync, not Pollux's overlap.
    assert int8_e.step_s == pytest.approx(int8_e.compute_s + int8_e.sync_s)
    assert int8_f.step_s < int8_f.compute_s + int8_f.sync_s
    dense = step(executor)
    assert dense.step_s < dense.compute_s + dense.sync_s  # dense still overlaps (DDP)


def test_a_tensor_parallel_group_across_machines_pays_the_network() -> None:
    tp2 = JobConfig(layout=Layout(world_size=2, tp=2), precision=PrecisionMap.uniform("bf16"))
    inside = step_time(GPT, tp2, Shape(gpu_model="V100M32", ranks_per_node=(2,)), 64)
    across = step_time(
        GPT, tp2, Shape(gpu_model="V100M32", ranks_per_node=(1, 1), inter_node_gbps=1.0), 64
    )
    assert across.tp_comm_s > 100 * inside.tp_comm_s  # 1 GB/s against NVLink
    assert across.compute_s - inside.compute_s == pytest.approx(across.tp_comm_s - inside.tp_comm_s)


def test_pipeline_bubble_and_checkpointing_cost_time() -> None:
    shape = Shape(gpu_model="A100", ranks_per_node=(4,))
    plain = step_time(GPT, _config(4), shape, 64)
    piped = step_time(GPT, _config(4, dp=2, pp=2, micro_batches=1), shape, 64)
    assert piped.bubble == pytest.approx(0.5)
    ckpt = step_time(GPT, _config(4, activation_checkpointing=True), shape, 64)
    assert ckpt.compute_s > plain.compute_s


def test_a_pipeline_sends_one_blocks_activations_per_micro_batch_across_machines() -> None:
    """Across two machines at 1 Gbit/s, each micro-batch crosses the stage boundary twice
    (forward and backward): a transformer's micro_batch x seq_len x hidden values; another
    model's one block's share of its activations (a ResNet's feature maps), not one value
    per sample."""
    from dataclasses import replace

    from autotune.catalog.tasks import BUILTIN_TASKS

    shape = Shape(gpu_model="CPU", ranks_per_node=(1, 1), inter_node_gbps=0.125)
    coeffs = Coefficients(inter_bw_efficiency=1.0)
    piped = JobConfig(
        layout=Layout(world_size=2, pp=2, micro_batches=4),
        precision=PrecisionMap.uniform("fp32"),
    )
    resnet = BUILTIN_TASKS["resnet-mini"].profile
    assert resnet.hidden_size == 0
    got = step_time(resnet, piped, shape, 64, coeffs=coeffs).pp_comm_s
    boundary = 16 * resnet.activation_bytes_per_sample / resnet.num_layers * 4 / 2
    assert got == pytest.approx(2 * 4 * boundary / 0.125e9)
    heavier = replace(resnet, activation_bytes_per_sample=2 * resnet.activation_bytes_per_sample)
    assert step_time(heavier, piped, shape, 64, coeffs=coeffs).pp_comm_s == pytest.approx(2 * got)
    gpt = BUILTIN_TASKS["gpt-char"].profile
    message = 16 * gpt.seq_len * gpt.hidden_size * 4
    assert step_time(gpt, piped, shape, 64, coeffs=coeffs).pp_comm_s == pytest.approx(
        2 * 4 * message / 0.125e9
    )


def test_low_precision_is_faster_where_the_device_has_it() -> None:
    shape = Shape(gpu_model="T4", ranks_per_node=(1,))
    fp32 = JobConfig(layout=Layout(world_size=1), precision=PrecisionMap.uniform("fp32"))
    fp16 = JobConfig(layout=Layout(world_size=1), precision=PrecisionMap.uniform("fp16"))
    bf16 = JobConfig(layout=Layout(world_size=1), precision=PrecisionMap.uniform("bf16"))
    t = {
        name: step_time(GPT, c, shape, 8).step_s
        for name, c in {"fp32": fp32, "fp16": fp16, "bf16": bf16}.items()
    }
    assert t["fp16"] < t["fp32"] < t["bf16"]  # T4 has no bf16 units


def test_statistical_efficiency_terms() -> None:
    assert batch_efficiency(GPT, GPT.reference_batch) == 1.0
    assert batch_efficiency(GPT, 4 * GPT.reference_batch) < 1.0
    # A step's gain (what the executor scales the learning rate by) is the batch's
    # efficiency times the samples it takes: one formula for both.
    m0 = GPT.reference_batch
    assert batch_gain(GPT.noise_scale, m0, 4 * m0) == pytest.approx(
        4 * batch_efficiency(GPT, 4 * m0)
    )
    assert batch_gain(400.0, 64, 256) == pytest.approx(4 * (400 + 64) / (400 + 256))
    assert batch_gain(400.0, 64, 64) == 1.0
    assert batch_gain(0.0, 64, 256) == 4.0  # noise unknown: every sample counts
    assert compression_efficiency(CompressionSpec()) == 1.0
    assert (
        compression_efficiency(CompressionSpec(kind="topk", ratio=0.001))
        < compression_efficiency(CompressionSpec(kind="topk", ratio=0.1))
        < 1.0
    )


def test_oom_gives_no_goodput() -> None:
    big = MODEL_CATALOG["gpt-70b"]
    est = estimate(big, _config(1), Shape(gpu_model="T4", ranks_per_node=(1,)), 8)
    assert est.oom
    assert est.goodput == 0.0
    small = estimate(GPT, _config(1), Shape(gpu_model="A100", ranks_per_node=(1,)), 8)
    assert not small.oom
    assert small.goodput > 0
    assert small.power_watts > 0


def test_shipped_straggler_table_matches_the_trace(tmp_path: Path) -> None:
    source = SHARED_DATA / "alibaba-v2020-minibatch"
    path = source / "coefficient_variation.csv.gz"
    if not path.is_file():
        pytest.skip(f"public traces not present at {source}")
    assert tuple(derive(path)) == job_cvs()
    assert all(math.isfinite(v) and v >= 0 for v in job_cvs())


def test_straggler_file_errors_name_the_row(tmp_path: Path) -> None:
    bad = tmp_path / "cv.csv"
    bad.write_text(",0,1\njob_0,0.1,0.2\njob_1,-0.5,0.1\n")
    from autotune.errors import InputError

    with pytest.raises(InputError, match="row 3"):
        derive(bad)
    assert json.loads(json.dumps(job_cvs()))  # the shipped table is plain numbers
