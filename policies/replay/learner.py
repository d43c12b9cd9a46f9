"""The loss of ``autotune replay train``: RLlib's MARWIL loss (BC when ``beta`` is 0)
with the logged action's log-likelihood counted over the action entries that mattered.

A logged action has 7 entries, but not all of them acted: a running job that kept its
configuration used only ``change``, a waiting job used every entry but ``change``
(``autotune.policies.serving.action_mask``). The others were drawn by the acting policy
and ignored by the decision step; imitating them would only copy the acting policy's
preference where the outcome says nothing. The batch carries the mask in the
``action_mask`` column (RLlib's reader passes extra Parquet columns through to the train
batch); without it every entry counts, as in RLlib's own loss.

In its own module (importing torch and RLlib) because RLlib instantiates the class by
reference inside its workers.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.algorithms.marwil.marwil_learner import (
    LEARNER_RESULTS_MOVING_AVG_SQD_ADV_NORM_KEY,
    LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY,
)
from ray.rllib.algorithms.marwil.torch.marwil_torch_learner import MARWILTorchLearner
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.learner import POLICY_LOSS_KEY, VF_LOSS_KEY
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.torch_utils import explained_variance

from autotune.policies.replay.train import MASK_COLUMN
from autotune.rl.action import ACTION_DIMS

__all__ = ["MaskedMARWILLearner", "masked_log_likelihood"]


def masked_log_likelihood(
    logits: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """``(B,)`` log-probability of ``actions`` ``(B, 7)`` under the categorical
    distributions of ``logits`` ``(B, sum(ACTION_DIMS))``, summed over the entries where
    ``mask`` ``(B, 7)`` is true (all entries when ``mask`` is ``None``)."""
    parts = torch.split(logits, list(ACTION_DIMS), dim=-1)
    per_entry = torch.stack(
        [
            torch.log_softmax(part, dim=-1).gather(-1, actions[:, d : d + 1].long()).squeeze(-1)
            for d, part in enumerate(parts)
        ],
        dim=-1,
    )
    if mask is not None:
        per_entry = per_entry * mask.to(per_entry.dtype)
    return per_entry.sum(-1)


class MaskedMARWILLearner(MARWILTorchLearner):
    """``MARWILTorchLearner`` whose log-likelihood term counts the masked-in entries
    only; everything else (advantage weights, their moving normaliser, the value loss and
    the logged metrics) is RLlib's."""

    def compute_loss_for_module(
        self,
        *,
        module_id: str,
        config: Any = None,
        batch: dict[str, Any],
        fwd_out: dict[str, Any],
    ) -> torch.Tensor:
        module: Any = self.module[module_id].unwrapped()
        if Columns.LOSS_MASK in batch:
            # MARWIL appends one step to every episode for the value bootstrap; it is
            # not a logged decision.
            valid: torch.Tensor = batch[Columns.LOSS_MASK].bool()
            count = valid.sum().clamp(min=1)

            def mean(x: torch.Tensor) -> torch.Tensor:
                return x[valid].sum() / count

        else:

            def mean(x: torch.Tensor) -> torch.Tensor:
                return x.mean()

        log_probs = masked_log_likelihood(
            fwd_out[Columns.ACTION_DIST_INPUTS], batch[Columns.ACTIONS], batch.get(MASK_COLUMN)
        )
        policy_loss: torch.Tensor
        if config.beta == 0.0:
            policy_loss = -mean(log_probs)
            self.metrics.log_value((module_id, POLICY_LOSS_KEY), policy_loss, window=1)
            return policy_loss
        values = module.compute_values(batch, embeddings=fwd_out.get(Columns.EMBEDDINGS))
        advantages = batch[Columns.VALUE_TARGETS] - values
        squared = mean(advantages.pow(2.0))
        vf_loss = 0.5 * squared
        norms: Any = self.moving_avg_sqd_adv_norms_per_module
        norms[module_id] = (
            config.moving_average_sqd_adv_norm_update_rate * (squared.detach() - norms[module_id])
            + norms[module_id]
        )
        weights = torch.exp(config.beta * advantages / (1e-8 + norms[module_id].sqrt())).detach()
        policy_loss = -mean(weights * log_probs)
        total: torch.Tensor = policy_loss + config.vf_coeff * vf_loss
        self.metrics.log_dict(
            {
                POLICY_LOSS_KEY: policy_loss,
                VF_LOSS_KEY: vf_loss,
                LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY: explained_variance(
                    batch[Postprocessing.VALUE_TARGETS], values
                ),
                LEARNER_RESULTS_MOVING_AVG_SQD_ADV_NORM_KEY: norms[module_id],
            },
            key=module_id,
            window=1,
        )
        return total
