"""The fallback: another policy deciding where the intended one cannot, said as such.

One definition of what a fallback decision is, for every place that falls back: the
daemon when its policy has failed ``FALLBACK_AFTER`` ticks in a row
(``autotune.daemon.tick``), and the learned policy for the jobs it cannot decide (a
checkpoint that does not load, a module that fails, a slot that decodes to no
configuration: ``autotune.policies.serving``). Every choice the fallback makes has
``source="fallback"`` and says why before its own reason.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from autotune.interfaces import ClusterSnapshot, Policy, PolicyChoice

__all__ = ["fallback_choices"]


def fallback_choices(
    fallback: Policy,
    snapshot: ClusterSnapshot,
    why: str,
    *,
    job_ids: Collection[str] | None = None,
) -> dict[str, PolicyChoice]:
    """``fallback``'s choices for ``snapshot``, each with ``source="fallback"`` and the
    reason ``"<why>: <its own reason>"``; only those of ``job_ids`` where given."""
    return {
        job_id: replace(choice, source="fallback", reason=f"{why}: {choice.reason}")
        for job_id, choice in fallback.decide(snapshot).choices.items()
        if job_ids is None or job_id in job_ids
    }
