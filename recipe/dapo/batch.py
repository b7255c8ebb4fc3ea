"""Rollout responses as a veRL ``DataProto`` (veRL's tensor layout), rewards from veRL's DAPO reward manager,
and DAPO's group filter.

Layout as in veRL: ``prompts`` [B, P] left-padded, ``responses`` [B, R] right-padded, ``input_ids`` and
``attention_mask`` [B, P+R], ``response_mask`` [B, R]; non-tensor ``uid`` (the prompt group),
``data_source``, ``reward_model``. Rewards: ``token_level_scores`` / ``token_level_rewards`` with the
scalar at the last response token, from veRL's reward loop with its DAPO reward manager.
"""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import DictConfig

from recipe.dapo.rollout import Response
from recipe.data.loader import Problem

# what a response may carry for the online MTP head's steps on the rows the update leaves out (their trunk states and
# the policy's distribution there); the update runs the trunk over its own rows and drops them
ROLLOUT_TEACHER_KEYS = ("trunk_states", "teacher_topk", "token_logprobs")


def build_batch(
    responses: list[Response],
    problems: list[Problem],
    uids: list[str],
    pad_id: int,
    prompt_width: int,
    response_width: int,
):
    """A veRL DataProto for ``responses``; ``problems[r.prompt_index]`` / ``uids[...]`` give each one's group, and
    ``trunk_states``, ``teacher_topk`` and ``token_logprobs`` hold what the rollout kept for the online MTP head where
    the responses carry it (:class:`~recipe.dapo.rollout.Response`).

    Prompts are left-padded to ``prompt_width`` and responses right-padded to ``response_width``
    (``data.max_prompt_length`` / ``data.max_response_length``, as veRL pads them), so batches of different
    generation rounds concatenate."""
    from verl import DataProto

    p_len = max(prompt_width, max(len(r.prompt_ids) for r in responses))
    r_len = max(response_width, max(len(r.token_ids) for r in responses))
    b = len(responses)
    prompts = torch.full((b, p_len), pad_id, dtype=torch.long)
    resp = torch.full((b, r_len), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p_len + r_len), dtype=torch.long)
    for i, r in enumerate(responses):
        prompts[i, p_len - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
        attn[i, p_len - len(r.prompt_ids) : p_len] = 1
        if r.token_ids:
            resp[i, : len(r.token_ids)] = torch.tensor(r.token_ids)
            attn[i, p_len : p_len + len(r.token_ids)] = 1
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    tensors = {
        "prompts": prompts,
        "responses": resp,
        "input_ids": torch.cat([prompts, resp], dim=1),
        "attention_mask": attn,
        "position_ids": position_ids,
        "response_mask": attn[:, p_len:].clone(),
    }
    non_tensors = {
        "uid": np.array([uids[r.prompt_index] for r in responses], dtype=object),
        "data_source": np.array([problems[r.prompt_index].data_source for r in responses], dtype=object),
        "reward_model": np.array(
            [{"style": "rule", "ground_truth": problems[r.prompt_index].ground_truth} for r in responses], dtype=object
        ),
        "extra_info": np.array([{"index": problems[r.prompt_index].index} for r in responses], dtype=object),
    }
    for key in ROLLOUT_TEACHER_KEYS:  # ragged: an object array of one array per row, where the responses carry it
        if getattr(responses[0], key) is not None:
            non_tensors[key] = np.empty(b, dtype=object)
            for i, r in enumerate(responses):
                non_tensors[key][i] = getattr(r, key)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


class RewardFunction:
    """veRL's reward path of its V1 trainer, run in this process: a ``RewardLoopWorker`` built from veRL's config
    of the run (``reward.reward_manager``: DAPO's rule score + overlong buffer from ``reward.reward_kwargs``, the
    scorer named by ``reward.custom_reward_function``), scores assembled at the last response token as veRL's
    reward loop does. On backend=verl the same config reaches the same classes in Ray workers."""

    def __init__(self, verl_cfg: DictConfig):
        from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
        from verl.trainer.ppo.reward import resolve_reward_manager_cls

        self.worker = RewardLoopWorker(verl_cfg)
        self.manager_cls = resolve_reward_manager_cls(verl_cfg)

    def __call__(self, batch) -> dict[str, np.ndarray]:
        """Adds ``token_level_scores``/``token_level_rewards`` to ``batch``; returns per-response extras."""
        outputs = self.worker.loop.run_until_complete(self.worker.compute_score_batch(batch))
        scores = self.manager_cls.assemble_rm_scores(batch, [o["reward_score"] for o in outputs])
        batch.batch["token_level_scores"] = scores
        batch.batch["token_level_rewards"] = scores
        infos = [o.get("reward_extra_info", {}) for o in outputs]
        extras = {k: np.asarray([info[k] for info in infos]) for k in infos[0]}
        for k, v in extras.items():
            if v.dtype != object:
                batch.non_tensor_batch[k] = v
        batch.non_tensor_batch["reward"] = scores.sum(-1).numpy()  # veRL V1's canonical filter metric
        return extras


def kept_groups(batch, metric: str) -> list[str]:
    """DAPO dynamic sampling: uids whose ``metric`` varies within the group (or singleton groups), in order."""
    values: dict[str, list[float]] = {}
    for uid, v in zip(batch.non_tensor_batch["uid"], batch.non_tensor_batch[metric], strict=True):
        values.setdefault(uid, []).append(float(v))
    return [uid for uid, vals in values.items() if np.std(vals) > 0 or len(vals) == 1]


def select_groups(batch, uids: list[str]):
    """Rows of ``batch`` belonging to ``uids`` (group order preserved)."""
    wanted = set(uids)
    idx = [i for i, u in enumerate(batch.non_tensor_batch["uid"]) if u in wanted]
    return batch[idx]


def spread_rows(batch, rng: np.random.Generator, max_rows: int = 0, max_tokens: float = 0.0):
    """Rows of ``batch`` (order preserved) drawn at random one group at a time: a row of every group before a second
    of any, so a capped share covers as many prompts as it can. At most ``max_rows`` rows and at most ``max_tokens``
    response tokens in all, the draw's longest prefix within both (0: no cap)."""
    if max_rows <= 0 and max_tokens <= 0:
        return batch
    uids = batch.non_tensor_batch["uid"]
    order = rng.permutation(len(batch))
    group_rank = {u: r for r, u in enumerate(rng.permutation(sorted(set(uids))))}
    seen: dict[str, int] = {}
    within = np.empty(len(batch), dtype=np.int64)
    for i in order:
        within[i] = seen.get(uids[i], 0)
        seen[uids[i]] = within[i] + 1
    rank = np.array([group_rank[u] for u in uids])
    drawn = np.lexsort((rank, within))
    if max_rows > 0:
        drawn = drawn[:max_rows]
    if max_tokens > 0:
        tokens = batch.batch["response_mask"].sum(-1).numpy()[drawn]
        drawn = drawn[: int(np.searchsorted(np.cumsum(tokens), max_tokens, side="right"))]
    return batch[np.sort(drawn).tolist()]
