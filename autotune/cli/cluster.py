"""``autotune cluster describe``: a cluster file from a running Ray cluster."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from autotune.cli.common import JsonOption, progress_bar, user_errors

__all__ = ["cluster_app"]

cluster_app = typer.Typer(
    help="Describe the cluster autotune runs on: its nodes and measured links.",
    no_args_is_help=True,
)


@cluster_app.command("describe")
@user_errors
def describe_command(
    ray_address: Annotated[
        str,
        typer.Option("--ray-address", help="The Ray cluster to describe (HOST:PORT, or auto)."),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Where to write the cluster file (default: <data dir>/cluster.json)."
        ),
    ] = None,
    links: Annotated[
        bool,
        typer.Option(
            "--links/--no-links",
            help="Measure each machine's link to the first by an all-reduce between them.",
        ),
    ] = True,
    mib: Annotated[
        float, typer.Option("--mib", min=0.001, help="MiB each link's all-reduce moves.")
    ] = 16.0,
    as_json: JsonOption = False,
) -> None:
    """Write a cluster file: the Ray cluster's nodes as the Ray backend sees them (GPU
    model and count, or one CPU device per logical CPU; host memory) and, with --links,
    each machine's link to the first measured (bandwidth each way from an all-reduce of
    --mib MiB, latency from one of 4 bytes), each node's inter-node bandwidth set to the
    slowest link measured from it. ``autotune daemon --cluster-file`` and the Ray
    backend use the measured links; the simulated cluster can be built from the file."""
    from autotune.catalog.clusters import ClusterDescription, save_cluster
    from autotune.daemon.settings import Settings
    from autotune.executor.cluster import ray_cluster
    from autotune.executor.links import measure_links
    from autotune.ray_session import ensure_ray

    target = out or Settings().data_dir / "cluster.json"
    started = ensure_ray(ray_address)
    try:
        nodes = ray_cluster().alive
        measured = []
        if links and len(nodes) > 1:
            progress = progress_bar(
                "measuring links", "{task.completed}/{task.total} {task.fields[note]}"
            )
            bar = progress.add_task("links", total=len(nodes) - 1, note="")
            with progress:
                measured = measure_links(
                    nodes,
                    nbytes=int(mib * 2**20),
                    progress=lambda done, _n, what: progress.update(bar, completed=done, note=what),
                )
    finally:
        if started:
            import ray

            ray.shutdown()
    description = ClusterDescription(
        nodes=tuple(nodes),
        links=tuple(measured),
        source=f"ray://{ray_address}",
        described_at=datetime.now(UTC).isoformat(timespec="seconds"),
    ).with_measured_links()
    save_cluster(description, target)
    if as_json:
        typer.echo(json.dumps({"saved_to": str(target), **description.to_json()}))
        return
    for node in description.nodes:
        typer.echo(
            f"{node.node_id:<28} {node.gpu_count:>3} x {node.gpu_model or 'CPU':<10} "
            f"{node.memory_mib / 1024:7.1f} GiB host, "
            f"link {node.inter_node_bandwidth_gbps * 8:,.2f} Gbit/s"
        )
    for link in description.links:
        typer.echo(
            f"link {link.a} <-> {link.b}: {link.gbps * 8e3:,.1f} Mbit/s each way, "
            f"latency {link.latency_s * 1e3:.2f} ms"
        )
    typer.echo(f"saved {target}")
