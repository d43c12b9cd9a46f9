"""Policies from registered versions: the ``PolicyLoader`` the daemon's policy lifecycle
(``autotune.daemon.lifecycle``) and the API's ``POST /policies`` use.

A version is a checkpoint (an RLModule folder, or an algorithm checkpoint holding one)
loaded by ``PolicyServer`` and served by ``LearnedPolicy`` with the daemon's slots,
round period, exploration floor and seed; or, for ``kind`` ``rules`` without a
checkpoint, the rule-based policy. Its version is ``<kind>-<first 12 hex digits of the
checkpoint's content hash>`` (``checkpoint_hash``), so the same weights are the same
version wherever they are stored.
"""

from __future__ import annotations

from pathlib import Path

from autotune.core import DEFAULT_ROUND_S
from autotune.daemon.lifecycle import CheckpointInfo
from autotune.errors import InputError
from autotune.interfaces import Policy
from autotune.policies.rules import RulesPolicy
from autotune.policies.serving import LearnedPolicy, PolicyServer, checkpoint_hash

__all__ = ["CheckpointPolicies"]


class CheckpointPolicies:
    """Builds the daemon's policies from checkpoints: ``slots``, ``round_s``,
    ``epsilon`` (the active policy's exploration floor; a shadow explores never) and
    ``seed`` as the daemon's own policy has them."""

    def __init__(
        self,
        *,
        slots: int = 32,
        round_s: float = DEFAULT_ROUND_S,
        epsilon: float = 0.0,
        seed: int = 0,
        forecast: bool | str = True,
    ) -> None:
        self.slots = slots
        self.round_s = round_s
        self.epsilon = epsilon
        self.seed = seed
        self.forecast = forecast

    def inspect(self, checkpoint: str, kind: str) -> CheckpointInfo:
        """Load the checkpoint at ``checkpoint`` as the daemon would (spaces checked,
        weights present); ``InputError`` with the reason when it does not serve."""
        path = Path(checkpoint).expanduser()
        if not path.is_absolute():
            raise InputError(f"checkpoint {checkpoint!r}: give an absolute path")
        if not path.is_dir():
            raise InputError(f"no checkpoint folder at {path}")
        server = PolicyServer(path, slots=self.slots)  # IncompatiblePolicyError: an InputError
        content_hash = checkpoint_hash(server.path)
        return CheckpointInfo(
            path=str(path.resolve()),
            content_hash=content_hash,
            kind=kind,
            version=f"{kind}-{content_hash[:12]}",
        )

    def build(
        self, kind: str, checkpoint: str | None, *, shadow: bool, follow: Policy | None
    ) -> Policy:
        """The policy of a registered version; raises ``InputError`` with the reason when
        its checkpoint does not load (never falls back to the rules silently)."""
        if checkpoint is None:
            if kind == "rules":
                return RulesPolicy()
            raise InputError(f"a {kind} policy needs a checkpoint")
        server = PolicyServer(checkpoint, slots=self.slots)
        policy = LearnedPolicy(
            slots=self.slots,
            round_s=self.round_s,
            forecast=self.forecast,
            server=server,
            epsilon=0.0 if shadow else self.epsilon,
            seed=self.seed,
            kind=kind,
        )
        if isinstance(follow, LearnedPolicy):
            policy.encoder.continue_from(follow.encoder)
        return policy

    def describe(self, policy: Policy) -> CheckpointInfo | None:
        """The checkpoint a learned policy serves (``None`` for the rules, or a learned
        policy that fell back to them)."""
        if not isinstance(policy, LearnedPolicy) or policy.server is None:
            return None
        content_hash = policy.content_hash or checkpoint_hash(policy.server.path)
        return CheckpointInfo(
            path=str(Path(policy.server.path).resolve()),
            content_hash=content_hash,
            kind=policy.kind,
            version=policy.version,
        )
