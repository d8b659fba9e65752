"""The names of the batch fields that packages exchange (DataProto keys), one place each.

This is the contract table of the design ("Batch fields"), with verl's names so users feel
at home: the constants' values must never change. Use them wherever a field is read or
written across packages (``batch[fields.RESPONSE_MASK]``), so a reader can jump to the
field's shape, dtype and producer from any use.

Shapes: ``B`` rows (samples), ``P`` padded prompt width (prompts are left-padded), ``R``
padded response width (responses are right-padded), ``P + R`` a prompt joined with its
response. ``(B, R)`` float tensors are 0 on response pads. Stages: data loader
(``hf_algos.data``), rollout (``hf_rollout``), reward (``hf_algos.rewards``), actor /
reference / critic workers (``hf_engines.workers``), advantage (``hf_algos.advantages``).
"""

from __future__ import annotations

from typing import Final

# --- Tensors: the prompt batch, then prompt + response ------------------------------------

INPUT_IDS: Final = "input_ids"
"""Token ids, int64. Data loader: ``(B, P)`` prompts, left-padded with the pad id. Rollout
(``build_rollout_output``): ``(B, P + R)``, prompt then response. Read by the rollout (the
prompts) and by every model forward (engines, reward model)."""

ATTENTION_MASK: Final = "attention_mask"
"""int64 0/1, shaped as :data:`INPUT_IDS`: 1 on the tokens a forward attends to. Written
with ``input_ids`` (data loader, then rollout); in a multi-turn rollout it covers tool
tokens too, which :data:`RESPONSE_MASK` excludes. Read by engines and reward scoring."""

POSITION_IDS: Final = "position_ids"
"""int64, shaped as :data:`INPUT_IDS`: positions counting real tokens from 0 (0 on left
pads); the rollout continues them after the prompt through the response. Written with
``input_ids``; read by model forwards (engines, reward model)."""

PROMPTS: Final = "prompts"
"""``(B, P)`` int64 prompt ids, left-padded: the prompt part of :data:`INPUT_IDS` after
rollout. Written by the rollout (and the SFT / DPO collates); read by metrics (the prompt
width) and anything that must split prompt from response."""

RESPONSES: Final = "responses"
"""``(B, R)`` int64 response ids, right-padded with the pad id. Written by the rollout (and
the SFT / DPO collates); read by engines (which tokens to score: the last ``R`` columns of
``input_ids``) and reward functions (decoded text)."""

RESPONSE_MASK: Final = "response_mask"
"""``(B, R)`` int64 0/1: 1 on the response tokens trained on (0 on pads and on tool tokens
of a multi-turn rollout). Written by the rollout (and the SFT / DPO collates); read by
every loss, the KL penalty, advantage estimators and metrics."""

ROLLOUT_LOG_PROBS: Final = "rollout_log_probs"
"""``(B, R)`` float32: log-prob of each sampled token under the rollout engine at the
sampling temperature. Written by the rollout; read by the trainer when the actor uses the
rollout's log-probs as ``old_log_probs``, and by rollout-correction terms."""

ROLLOUT_POLICY_VERSION: Final = "rollout_policy_version"
"""``(B, R)`` int64: the policy version (actor updates applied to the rollout's weights)
that sampled each response token; a partial rollout continued after a weight push holds
several versions, span by span. Written by the async driver
(:mod:`hf_algos.trainers.async_rollout.pipeline`); read by its staleness filter and metrics."""

# --- Tensors: reward, workers, advantage --------------------------------------------------

TOKEN_LEVEL_SCORES: Final = "token_level_scores"
"""``(B, R)`` float32: the sample's score on its last response token, 0 elsewhere.
Written by reward scoring (``RewardManager``, ``RewardModelScorer``); read by the KL
penalty, metrics and online DPO pairing."""

TOKEN_LEVEL_REWARDS: Final = "token_level_rewards"
"""``(B, R)`` float32: :data:`TOKEN_LEVEL_SCORES` minus the reward's KL penalty, if any
(``hf_algos.kl.penalized_rewards``; equal to the scores without one), written once by the
trainer's step. Read by advantage estimators and metrics."""

OLD_LOG_PROBS: Final = "old_log_probs"
"""``(B, R)`` float32: the actor's log-probs of the responses before the update, at the
batch :data:`TEMPERATURE`. Written by ``ActorWorker.compute_log_prob``; read by the policy
loss and the KL penalty."""

ENTROPYS: Final = "entropys"
"""``(B, R)`` float32: the actor's entropy per response token (verl's spelling). Written
by ``ActorWorker.compute_log_prob``; the losses compute their own entropy, so it is there
for inspection and metrics."""

REF_LOG_PROB: Final = "ref_log_prob"
"""``(B, R)`` float32: the reference model's log-probs of the responses. Written by
``ReferenceWorker.compute_ref_log_prob``; read by the KL penalty, the actor's KL loss and
the DPO loss."""

VALUES: Final = "values"
"""``(B, R)`` float32: the critic's value estimate per response token. Written by
``CriticWorker.compute_values``; read by GAE, the critic loss and metrics."""

ADVANTAGES: Final = "advantages"
"""``(B, R)`` float32, 0 off :data:`RESPONSE_MASK`. Written by ``compute_advantage``;
read by the actor (policy) loss and metrics."""

RETURNS: Final = "returns"
"""``(B, R)`` float32: value targets. Written by ``compute_advantage``; read by the critic
loss and metrics."""

REWARD_BASELINES: Final = "reward_baselines"
"""``(B,)`` float32: a per-sample reward baseline (ReMax: the greedy response's score).
Written by the trainer before ``compute_advantage``; read by the ``remax`` estimator."""

ROLLOUT_IS_WEIGHTS: Final = "rollout_is_weights"
"""``(B, R)`` float32: the rollout-correction weight of each response token (truncated or
masked importance ratio of ``old_log_probs`` over ``rollout_log_probs``), 0 on pads. Written
by the trainer when ``algorithm.rollout_correction.mode`` is not ``off``; read by the actor's
policy loss, which multiplies each token's loss by it."""

PROMPT_INDEX: Final = "prompt_index"
"""``(B,)`` int64: the position of each prompt row in the whole generation request, before
it is split over rollout workers. The rollout derives each row's random stream from the
sampling seed and this index, so the samples do not depend on how many workers share the
rows. Written by the trainer's generation request; read by the rollout worker and engines
(without it, each worker offsets the seed by its rank and counts rows from 0)."""

# --- Non-tensors (numpy object columns, one entry per row) --------------------------------

RAW_PROMPT: Final = "raw_prompt"
"""The prompt as given in the dataset: a string or a list of chat messages. Written by the
data loader; read by multi-turn environments (``reset``) and logging."""

RAW_PROMPT_IDS: Final = "raw_prompt_ids"
"""One unpadded list of prompt token ids per row, accepted by the rollout instead of the
:data:`INPUT_IDS` tensor (it left-pads them). Written by callers that hold token lists
(e.g. the multi-turn loop, per turn); read by the rollout."""

DATA_SOURCE: Final = "data_source"
"""str naming the task a row comes from (e.g. ``"gsm8k"``); picks the scoring function.
Written by the data loader (from the dataset row); read by reward scoring."""

REWARD_MODEL: Final = "reward_model"
"""dict holding the row's ``ground_truth`` (verl's layout). Written by the data loader;
read by reward scoring."""

EXTRA_INFO: Final = "extra_info"
"""dict (or None) of anything else a scoring function may need. Written by the data
loader; passed to scoring functions as ``extra_info``."""

UID: Final = "uid"
"""str id of the prompt a row was sampled for; rows repeated for ``n`` samples share it.
Written by the data loader (and the DPO collate, one per pair); read by group advantage
estimators (GRPO, RLOO) and online DPO pairing."""

REWARD_EXTRA_INFO: Final = "reward_extra_info"
"""dict per row of extra values a scoring function returned besides the score. Written by
``RewardManager``; read by logging."""

NUM_TURNS: Final = "num_turns"
"""int64 count of model turns of a multi-turn episode. Written by the multi-turn rollout,
for metrics and logging."""

ENV_REWARD: Final = "env_reward"
"""float64 sum of the rewards an environment gave over a multi-turn episode (0.0 when it
gives none). Written by the multi-turn rollout; added to the reward function's score by
``RewardManager`` when ``rollout.multi_turn.reward`` includes the environment."""

TOOL_CALLS: Final = "tool_calls"
"""int64 count of tool calls the model made in a multi-turn episode (well-formed or not).
Written by the multi-turn rollout, for metrics (the tool-call rate)."""

ENV_ERROR: Final = "env_error"
"""str: why a multi-turn episode was ended by its environment (it raised, hung past its
timeout, or returned malformed output), ``""`` when it was not. Written by the multi-turn
rollout; counted in the metrics, never raised."""

IS_CHOSEN: Final = "is_chosen"
"""bool: the row holds the chosen (True) or rejected (False) response of a DPO pair.
Written by the preference collate, for logging and checks."""

# --- meta_info keys -----------------------------------------------------------------------

TEMPERATURE: Final = "temperature"
"""float sampling temperature of the responses. Written by the rollout (the DPO / SFT
collates write 1.0); read by engines, which score log-probs at the same temperature."""

MINI_BATCH_TOTALS: Final = "mini_batch_totals"
"""dict ``{"tokens": float, "sequences": float}``: the response tokens and the sequences
(rows with at least one response token) of the whole mini-batch, over all data-parallel
ranks. Written by the training engines into every micro-batch's meta_info (a copy per
micro-batch); read by loss functions, which return their micro-batch's share of the
mini-batch loss (a sum over its tokens or sequences divided by these totals)."""

OLD_LOG_PROBS_FROM_UPDATE: Final = "old_log_probs_from_update"
"""bool: the batch carries no :data:`OLD_LOG_PROBS`; the update is one optimizer step over
the whole batch, so the actor's loss takes them from that step's own forward, detached (the
same numbers as a separate no-grad forward, one pass less). Written by the driver; read by
the actor's loss."""

METRICS: Final = "metrics"
"""dict name -> value (or list of values, one per worker after a gather). Written by any
worker call; read by the driver's tracking. ``DataProto.concat`` gathers it."""

GLOBAL_STEP: Final = "global_step"
"""int training step a call belongs to (in the design's contract for any worker call; no
package writes or reads it yet, so a driver may set it for workers that log per step)."""

SAMPLING: Final = "sampling"
"""dict of ``SamplingConfig`` fields for this generation call. Written by the driver;
read by ``RolloutWorker.generate_sequences`` (its own sampling config when absent)."""

MAX_PROMPT_LENGTH: Final = "max_prompt_length"
"""int width to left-pad :data:`RAW_PROMPT_IDS` to, so every rank's shard has one prompt
width. Written by the driver; read by ``RolloutWorker``."""

REWARD_ERRORS: Final = "reward_errors"
"""list of dicts, one per sample whose scoring failed (index, data source, error).
Written by ``RewardManager``; read (and removed) by the driver, which reports them."""
