"""Supervised training of the base policy and its MTP head on the embedded task's reference traces.

Builds everything the base checkpoint needs from a config: data splits, tokenizer, model; trains the
trunk with next-token CE and the MTP head with CE on detached inputs (the same isolation as online MTP
during RL), and writes an HF MiMo checkpoint plus a loss curve. Deterministic for a seed: one thread
order (``torch.use_deterministic_algorithms``), seeded init and data order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from mtp.checkpoint import is_complete, save_checkpoint
from mtp.loss import masked_ce, mtp_targets, next_token_targets
from mtp.model import MiMoConfig, MiMoForCausalLM
from recipe.data.loader import load_problems
from recipe.data.task import TaskConfig, write_splits
from recipe.data.tokenizer import train_tokenizer
from recipe.paths import REPO_ROOT, project_path

logger = logging.getLogger(__name__)


@dataclass
class TokenizedExample:
    ids: np.ndarray  # prompt + response token ids
    response_mask: np.ndarray  # 1 on response tokens (the trace and its EOS)


def encode_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of the chat-templated prompt, ending with the assistant header."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_example(tokenizer, messages: list[dict], response: str) -> TokenizedExample:
    """Chat-templated prompt followed by the response and EOS, with a response mask."""
    prompt_ids = encode_prompt(tokenizer, messages)
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = np.asarray(list(prompt_ids) + response_ids, dtype=np.int64)
    mask = np.zeros(len(ids), dtype=np.int64)
    mask[len(prompt_ids) :] = 1
    return TokenizedExample(ids, mask)


def pack_batches(
    examples: list[TokenizedExample], tokens_per_pack: int, rng: np.random.Generator
) -> list[list[TokenizedExample]]:
    """Shuffle, then greedily pack examples into streams of at most ``tokens_per_pack`` tokens."""
    order = rng.permutation(len(examples))
    packs, cur, cur_len = [], [], 0
    for i in order:
        ex = examples[i]
        if cur and cur_len + len(ex.ids) > tokens_per_pack:
            packs.append(cur)
            cur, cur_len = [], 0
        cur.append(ex)
        cur_len += len(ex.ids)
    if cur:
        packs.append(cur)
    return packs


def collate(pack: list[TokenizedExample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.from_numpy(np.concatenate([e.ids for e in pack]))
    mask = torch.from_numpy(np.concatenate([e.response_mask for e in pack]))
    lengths = torch.tensor([len(e.ids) for e in pack])
    cu = torch.zeros(len(pack) + 1, dtype=torch.long)
    cu[1:] = torch.cumsum(lengths, 0)
    return ids, mask, cu


def sft_loss(
    model: MiMoForCausalLM, ids: torch.Tensor, mask: torch.Tensor, cu: torch.Tensor, mtp_weight: float
) -> tuple[torch.Tensor, dict[str, float]]:
    out = model(ids, cu, detach_mtp_inputs=True)
    targets, lm_mask = next_token_targets(ids, mask, cu)
    lm_loss, lm_acc = masked_ce(out.logits, targets, lm_mask)
    loss = lm_loss
    stats = {"lm_loss": lm_loss.item(), "lm_acc": lm_acc.item()}
    for k, logits in enumerate(out.mtp_logits):
        t, m = mtp_targets(ids, mask, cu, depth=k)
        mtp_loss, mtp_acc = masked_ce(logits, t, m)
        loss = loss + mtp_weight * mtp_loss
        stats[f"mtp_{k}_loss"] = mtp_loss.item()
        stats[f"mtp_{k}_acc"] = mtp_acc.item()
    return loss, stats


BUILD_SOURCES = (  # the code that generates the task and tokenizer and trains the base model
    "recipe/data/task.py",
    "recipe/data/tokenizer.py",
    "recipe/data/loader.py",
    "recipe/paths.py",
    "recipe/sft/train.py",
    "mtp/model.py",
    "mtp/loss.py",
    "mtp/checkpoint.py",
)


SFT_HASH_KEY = "spec_rollout_sft_hash"  # config.json key of a checkpoint this module trained: the embedded base model


def is_embedded_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` holds a base model this module trained (on the embedded task, with its own tokenizer)."""
    config = Path(path) / "config.json"
    return config.is_file() and SFT_HASH_KEY in json.loads(config.read_text())


def code_fingerprint(root: Path = REPO_ROOT, sources: tuple[str, ...] = BUILD_SOURCES) -> str:
    """Hash of the source files that build the base model: changing that code rebuilds the cached checkpoint."""
    digest = hashlib.sha256()
    for name in sources:
        digest.update(name.encode() + b"\0" + (root / name).read_bytes())
    return digest.hexdigest()


def config_hash(cfg: DictConfig) -> str:
    """Hash of everything that determines the checkpoint: the config (not output paths) and the code."""
    full = OmegaConf.to_container(cfg, resolve=True)
    keep = {k: full[k] for k in ("seed", "data", "tokenizer", "model", "train")}
    keep["code"] = code_fingerprint()
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:12]


def lr_at(step: int, total: int, warmup: int, peak: float) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def build_data_and_tokenizer(cfg: DictConfig, work_dir: Path):
    task_cfg = TaskConfig(**OmegaConf.to_container(cfg.data.task, resolve=True))
    paths = write_splits(work_dir / "data", cfg.data.num_train, cfg.data.num_test, cfg.seed, task_cfg)
    train = load_problems(paths["train"])
    corpus = [m["content"] for p in train for m in p.messages] + [p.solution for p in train if p.solution]
    tokenizer = train_tokenizer(corpus, vocab_size=cfg.tokenizer.vocab_size)
    return paths, train, tokenizer


def train_base(cfg: DictConfig, out_dir: str | Path, progress: bool = True) -> Path:
    """Train the base model for ``cfg`` and write the checkpoint (and data) under ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    paths, train, tokenizer = build_data_and_tokenizer(cfg, out_dir)
    examples = [encode_example(tokenizer, p.messages, p.solution) for p in train if p.solution]

    model_cfg = MiMoConfig(vocab_size=len(tokenizer), **OmegaConf.to_container(cfg.model, resolve=True))
    model = MiMoForCausalLM(model_cfg)
    model.init_weights(cfg.seed)
    tc = cfg.train
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, betas=(0.9, 0.98), weight_decay=tc.weight_decay)
    rng = np.random.default_rng(cfg.seed)
    micro_per_step = max(1, tc.tokens_per_step // tc.tokens_per_micro)
    packs: list = []
    history = []
    bar = tqdm(range(tc.steps), desc="sft", disable=not progress, dynamic_ncols=True)
    start = time.time()
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tc.steps, tc.warmup_steps, tc.lr)
        opt.zero_grad(set_to_none=True)
        agg: dict[str, float] = {}
        for _ in range(micro_per_step):
            if not packs:
                packs = pack_batches(examples, tc.tokens_per_micro, rng)
            ids, mask, cu = collate(packs.pop())
            loss, stats = sft_loss(model, ids, mask, cu, tc.mtp_loss_scaling_factor)
            (loss / micro_per_step).backward()
            for k, v in stats.items():
                agg[k] = agg.get(k, 0.0) + v / micro_per_step
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip).item()
        opt.step()
        agg.update(step=step, grad_norm=grad_norm, lr=opt.param_groups[0]["lr"], elapsed_s=time.time() - start)
        history.append(agg)
        bar.set_postfix(lm=f"{agg['lm_loss']:.3f}", mtp=f"{agg.get('mtp_0_loss', 0):.3f}")

    ckpt = save_checkpoint(model, tokenizer, out_dir / "checkpoint", extra_config={SFT_HASH_KEY: config_hash(cfg)})
    (out_dir / "sft_history.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
    plot_loss_curve(history, out_dir / "sft_loss.png")
    return ckpt


def plot_loss_curve(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [h["lm_loss"] for h in history], label="next-token CE")
    mtp_keys = sorted(k for k in history[0] if k.startswith("mtp_") and k.endswith("_loss"))
    for k in mtp_keys:
        ax.plot(steps, [h[k] for h in history], label=f"MTP CE ({k[:-5]})")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (response tokens)")
    ax.set_title("Base model SFT")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def base_model_path(cfg: DictConfig) -> Path:
    """Where :func:`ensure_base_model` keeps the checkpoint for ``cfg`` (built or not)."""
    return project_path(cfg.cache_dir) / config_hash(cfg) / "checkpoint"


def ensure_base_model(cfg: DictConfig, progress: bool = True) -> Path:
    """The base checkpoint for ``cfg``, trained once and cached under ``cfg.cache_dir/<config hash>``.

    A directory without the completion marker (a crash mid-build) is rebuilt, never loaded.
    """
    ckpt = base_model_path(cfg)
    root = ckpt.parent
    if is_complete(ckpt) and (root / "data" / "train.parquet").is_file() and (root / "data" / "test.parquet").is_file():
        logger.info("reusing base model %s", ckpt)
        return ckpt
    if root.exists():
        logger.warning("base model cache %s is incomplete; rebuilding", root)
    return train_base(cfg, root, progress=progress)
