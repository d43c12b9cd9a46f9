"""Pins merged into configurations, the task allow-list and telemetry choice."""

from __future__ import annotations

import pytest

from autotune.catalog.profiles import MODEL_CATALOG
from autotune.catalog.tasks import BUILTIN_TASKS, resolve_task
from autotune.core import CompressionSpec, JobConfig, JobSpec, Layout, PrecisionMap
from autotune.daemon.telemetry import CachedSource, NvmlTelemetry, PsutilTelemetry, host_sources
from autotune.decision.overrides import check_override, pinned_config, pinned_placement
from autotune.envs.presets import default_nodes

BASE = JobConfig(
    layout=Layout(world_size=4, tp=2),
    precision=PrecisionMap.uniform("bf16"),
    compression=CompressionSpec(kind="int8"),
)


def test_a_pin_replaces_only_what_it_names() -> None:
    config = pinned_config(BASE, {"precision": {"ffn": "fp32"}})
    assert config.precision.ffn == "fp32"
    assert config.precision.attention_qkv == "bf16"
    assert config.layout == BASE.layout
    assert config.compression == BASE.compression
    topk = pinned_config(BASE, {"compression": {"kind": "topk", "ratio": 0.01}})
    assert topk.compression == CompressionSpec(kind="topk", ratio=0.01)


def test_pinning_the_world_size_makes_dp_the_rest() -> None:
    config = pinned_config(BASE, {"layout": {"world_size": 8}})
    assert (config.layout.dp, config.layout.tp, config.layout.pp) == (4, 2, 1)
    placed = pinned_config(
        BASE, {"placement": [{"node_id": "a100-0", "gpu_index": i} for i in range(2)]}
    )
    assert placed.world_size == 2
    assert placed.layout.dp == 1


@pytest.mark.parametrize(
    ("pin", "message"),
    [
        ({"layout": {"world_size": 3}}, "pin.layout"),
        ({"layout": {"speed": 3}}, "pin.layout.speed"),
        ({"precision": {"optimizer_state": "fp16"}}, "pin.precision"),
        ({"compression": {"kind": "powersgd"}}, "pin.compression"),
        ({"bogus": 1}, "pin.bogus"),
        (
            {"layout": {"world_size": 2}, "placement": [{"node_id": "a", "gpu_index": 0}]},
            "pin.layout.world_size=2",
        ),
    ],
)
def test_bad_pins_name_the_field(pin: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pinned_config(BASE, pin)


def test_a_pinned_placement_keeps_rank_order_and_the_jobs_gpu_share() -> None:
    spec = JobSpec(job_id="j", max_gpus=1, gpu_milli=500)
    placement = pinned_placement(spec, {"placement": [{"node_id": "t4-0", "gpu_index": 3}]})
    assert placement is not None
    assert [(s.rank, s.node_id, s.gpu_index, s.gpu_milli) for s in placement.ranks] == [
        (0, "t4-0", 3, 500)
    ]
    with pytest.raises(ValueError, match="two ranks of one job on the same GPU"):
        pinned_placement(
            JobSpec(job_id="j", max_gpus=2),
            {"placement": [{"node_id": "t4-0", "gpu_index": 0}] * 2},
        )


def test_check_override_uses_the_planners_memory_and_type_checks() -> None:
    nodes = default_nodes()
    spec = JobSpec(job_id="j", model=MODEL_CATALOG["gpt-350m"], max_gpus=8, global_batch=8)
    config, placement = check_override(
        spec, JobConfig.data_parallel(1), {"precision": {"ffn": "bf16"}}, nodes
    )
    assert placement is None
    assert config.precision.ffn == "bf16"
    only_v100 = JobSpec(job_id="v", max_gpus=2, gpu_types=("V100M32",))
    with pytest.raises(ValueError, match="rank 0 on A100"):
        check_override(
            only_v100,
            JobConfig.data_parallel(1),
            {"placement": [{"node_id": "a100-0", "gpu_index": 0}]},
            nodes,
        )


def test_tasks_are_built_in_or_on_the_allow_list_and_never_paths() -> None:
    assert resolve_task("gpt-char", []).model is BUILTIN_TASKS["gpt-char"].profile
    # the executor's gpt-char: 4 blocks of width 128 over a 256-byte vocabulary
    assert BUILTIN_TASKS["gpt-char"].profile.parameters == pytest.approx(0.87e6, rel=0.05)
    module_task = resolve_task("lab.tasks.vision:ResNet", ["lab.tasks"])
    assert module_task.model is None
    assert not module_task.builtin
    for name in ("lab.tasksx:Evil", "evil:Task", "lab/tasks.py:Task", "../x:Y", "lab.tasks"):
        with pytest.raises(ValueError, match="task"):
            resolve_task(name, ["lab.tasks"])


def test_telemetry_falls_back_to_psutil_without_nvml() -> None:
    if NvmlTelemetry.available() is not None:
        pytest.skip("this machine has NVIDIA GPUs: NVML is the source here")
    sources = host_sources()
    assert [s.name for s in sources] == ["psutil"]
    first = sources[0].read()
    assert first["cpu_count"] >= 1
    assert sources[0].read() is first  # cached for a second


def test_a_failing_source_reports_the_error_instead_of_raising() -> None:
    class Broken:
        name = "broken"

        def read(self) -> dict[str, object]:
            raise RuntimeError("driver went away")

    cached = CachedSource(Broken(), min_interval_s=0)
    assert cached.read() == {"error": "RuntimeError: driver went away"}
    assert "load_average_1m" in PsutilTelemetry().read()


@pytest.mark.ray
def test_ray_state_telemetry_reads_an_attached_cluster(local_ray: str) -> None:
    import ray

    from autotune.daemon.telemetry import RayStateTelemetry

    source = RayStateTelemetry(local_ray)
    assert source.name == "ray"
    figures = source.read()
    assert len(figures["nodes"]) == 1
    assert figures["nodes"][0]["alive"] is True
    assert figures["resources_total"]["CPU"] == ray.cluster_resources()["CPU"]
    # Actors come from the dashboard's state server; without it the figure is
    # absent and the reason is given, the rest still reads.
    assert figures["actors_alive"] is not None or "actors_error" in figures
