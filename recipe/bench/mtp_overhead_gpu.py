"""Online MTP's overhead on a policy update of SmolLM2-135M's shape on a GPU -> ``results/mtp/overhead_gpu.*``.

recipe/bench/mtp_overhead.py times the local and veRL backends' own updates on this CPU. The lent GPU machine has
neither veRL nor vLLM, so this runs the local actor's update (``recipe.dapo.policy.Actor.update``) arithmetic on the
project's own model (``mtp.model.MiMoForCausalLM``, SmolLM2's trunk in MiMo's layout plus one MTP layer) and loss
(``mtp.loss``): a no-grad old-log-prob forward over every micro-batch, then per ppo mini-batch the training forward,
DAPO's clipped token-mean loss (clip 0.2 / 0.28), backward, gradient clipping and AdamW. Frozen: the head's loss is
logged from the old-log-prob forward, as the local actor does. Online: the training forward adds 0.2 x the MTP loss
on detached inputs, as ``recipe.dapo.policy.forward_rows`` builds it: ``--objective`` (``mtp.loss.mtp_loss``; the
policy's logits one position later as the teacher) over a random share of the sequences (``--fractions``,
``mtp.loss.sample_sequences``: spec.mtp.loss_sequence_fraction). fp32 weights, bf16 autocast,
random weights in the model's shape (cost does not depend on their values). Modes alternate on the same batch; the
overhead is the median over reps of online / frozen.

    python -m recipe.bench mtp-overhead --gpu --out results/mtp   # on a machine with a CUDA GPU
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType

from mtp import MTP_OBJECTIVES
from mtp.loss import mtp_loss, mtp_targets, roll_packed, sample_sequences
from mtp.model import MiMoConfig, MiMoForCausalLM
from recipe.models import BUILTIN_SHAPES
from recipe.paths import RESULTS_DIR

SHAPES = {  # MiMoConfig.from_hf_dict keeps the fields the MiMo model has
    **{name: MiMoConfig.from_hf_dict(shape) for name, shape in BUILTIN_SHAPES.items()},
    "tiny": MiMoConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2
    ),
}


def packed_micro_batch(rows: int, prompt: int, response: int, vocab: int, device: str) -> dict[str, torch.Tensor]:
    """``rows`` sequences of ``prompt`` + ``response`` random tokens packed into one stream, with the response mask,
    per-token advantages (one +-1 outcome per row) and ``cu_seqlens``."""
    length = prompt + response
    ids = torch.randint(0, vocab, (rows * length,), device=device)
    response_mask = torch.zeros(rows, length, device=device)
    response_mask[:, prompt:] = 1
    advantages = (torch.randint(0, 2, (rows, 1), device=device).float() * 2 - 1).expand(rows, length).reshape(-1)
    cu_seqlens = torch.arange(0, rows * length + 1, length, device=device)
    return dict(input_ids=ids, response_mask=response_mask.reshape(-1), advantages=advantages, cu_seqlens=cu_seqlens)


def forward(
    model: MiMoForCausalLM, mb: dict, with_mtp: bool, fraction: float, objective: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs of the stream and the MTP loss (0 without MTP), as ``recipe.dapo.policy.forward_rows``."""
    positions = targets_mtp = None
    if with_mtp:
        every, trained = mtp_targets(mb["input_ids"], mb["response_mask"], mb["cu_seqlens"], depth=0)
        positions = sample_sequences(trained.nonzero().squeeze(-1), mb["cu_seqlens"], fraction)
        targets_mtp = every[positions]
    with torch.autocast(mb["input_ids"].device.type, dtype=torch.bfloat16):
        out = model(
            mb["input_ids"], mb["cu_seqlens"], with_mtp=with_mtp, detach_mtp_inputs=True, mtp_positions=positions
        )
    logits = out.logits.float()
    logp = F.log_softmax(logits, dim=-1)
    targets = roll_packed(mb["input_ids"], mb["cu_seqlens"], -1)
    token_logp = logp.gather(-1, targets[:, None]).squeeze(-1)
    head_loss = torch.zeros((), device=token_logp.device)
    if with_mtp:
        teacher = logits.detach()[positions + 1] if objective != "sampled" else None
        head_loss, _ = mtp_loss(objective, out.mtp_logits[0], targets_mtp, teacher)
    return token_logp, head_loss


def update(
    model, optimizer, mtp_params, micro_batches: list[dict], mini: int, online: bool, fraction: float, objective: str
) -> None:
    """One policy update over ``micro_batches`` (``mini`` micro-batches per optimizer step)."""
    with torch.no_grad():
        olds = [forward(model, mb, not online, 1.0, objective)[0] for mb in micro_batches]
    for p in mtp_params:
        p.requires_grad_(online)
    trunk_params = [p for p in model.parameters() if all(p is not q for q in mtp_params)]
    for m0 in range(0, len(micro_batches), mini):
        optimizer.zero_grad(set_to_none=True)
        group = list(range(m0, min(m0 + mini, len(micro_batches))))
        tokens = sum(float(micro_batches[i]["response_mask"].sum()) for i in group)
        for i in group:
            mb = micro_batches[i]
            logp, head_loss = forward(model, mb, online, fraction, objective)
            mask = roll_packed(mb["response_mask"], mb["cu_seqlens"], -1)
            ratio = torch.exp(logp - olds[i])
            adv = roll_packed(mb["advantages"], mb["cu_seqlens"], -1)
            pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - 0.2, 1 + 0.28))
            share = float(mask.sum()) / max(1.0, tokens)
            loss = (pg * mask).sum() / max(1.0, tokens) + (0.2 * head_loss * share if online else 0.0)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(trunk_params, 1.0)
        if online:
            torch.nn.utils.clip_grad_norm_(mtp_params, 1.0)
        optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=64, help="responses per update (prompts x n)")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens per row")
    parser.add_argument("--response", type=int, default=512, help="response tokens per row")
    parser.add_argument("--micro", type=int, default=8, help="rows per micro-batch")
    parser.add_argument("--mini", type=int, default=2, help="micro-batches per optimizer step")
    parser.add_argument(
        "--fractions", default="1.0,0.25", help="online MTP: share of the sequences trained (loss_sequence_fraction)"
    )
    parser.add_argument(
        "--objective", choices=MTP_OBJECTIVES, default="acceptance", help="spec.mtp.objective (+experiment=smollm2's)"
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=str(RESULTS_DIR / "mtp"))
    parser.add_argument(
        "--measure",
        choices=["wall", "device"],
        default="wall",
        help="wall clock, or the update's summed GPU kernel time (robust to a host-bound, noisy update)",
    )
    parser.add_argument("--profile", action="store_true", help="print where one update of each mode spends its time")
    args = parser.parse_args()
    fractions = [float(f) for f in args.fractions.split(",")]
    if args.measure == "device" and args.device != "cuda":
        raise SystemExit("--measure device sums GPU kernel times: it needs --device cuda")
    if any(not 0 < f <= 1 for f in fractions):
        raise SystemExit(f"--fractions {args.fractions}: each must be in (0, 1]")

    torch.manual_seed(0)
    cfg = SHAPES[args.model]
    model = MiMoForCausalLM(cfg).to(args.device)
    model.init_weights(0)
    mtp_params = list(model.model.mtp_layers.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7)
    micro_batches = [
        packed_micro_batch(args.micro, args.prompt, args.response, cfg.vocab_size, args.device)
        for _ in range(args.rows // args.micro)
    ]

    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    def timed(online: bool, fraction: float) -> float:
        """Seconds of one update: wall clock, or with ``--measure device`` the sum of its kernels' times."""
        if args.measure == "device":
            with torch.profiler.profile(activities=activities) as prof:
                update(model, optimizer, mtp_params, micro_batches, args.mini, online, fraction, args.objective)
                torch.cuda.synchronize()
            kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
            return sum(e.self_device_time_total for e in kernels) / 1e6
        if args.device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        update(model, optimizer, mtp_params, micro_batches, args.mini, online, fraction, args.objective)
        if args.device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    modes = [("frozen", 1.0)] + [(f"online@{f:g}", f) for f in fractions]
    timed(False, 1.0), timed(True, 1.0)  # warm-up: allocator, kernels, AdamW state
    if args.profile:
        for online in (False, True):
            with torch.profiler.profile(activities=activities) as prof:
                timed(online, 1.0)
            sort = "self_cuda_time_total" if args.device == "cuda" else "self_cpu_time_total"
            print("online" if online else "frozen", prof.key_averages().table(sort_by=sort, row_limit=12), flush=True)
    seconds: dict[str, list[float]] = {name: [] for name, _ in modes}

    def write_report() -> None:
        """The report over the reps so far: written after every rep, so a run cut off keeps what it measured."""

        def median(xs: list[float]) -> float:
            return sorted(xs)[len(xs) // 2]

        device = torch.cuda.get_device_name() if args.device == "cuda" else args.device
        rows = []
        for name, fraction in modes[1:]:
            ratios = [o / f for o, f in zip(seconds[name], seconds["frozen"], strict=True)]
            rows.append(
                dict(mode=name, fraction=fraction, s_per_update=median(seconds[name]), overhead=median(ratios) - 1)
            )
        result = dict(device=device, args=vars(args), frozen_s_per_update=median(seconds["frozen"]), online=rows)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = (f"overhead_gpu_{args.measure}" if args.device == "cuda" else f"overhead_{args.device}_mirror") + (
            f"_{args.objective}"
        )
        (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
        tokens = args.rows * (args.prompt + args.response)
        lines = [
            f"# Online MTP overhead on a policy update, {args.model}'s shape, {device}",
            "",
            f"Produced by `python -m recipe.bench mtp-overhead --gpu --rows {args.rows} --prompt {args.prompt} --response "
            f"{args.response} --micro {args.micro} --mini {args.mini} --fractions {args.fractions} --objective {args.objective} "
            f"--reps {args.reps} --measure {args.measure}` "
            f"(torch {torch.__version__}): {args.rows} rows of {args.prompt} + {args.response} tokens ({tokens} tokens), "
            f"micro-batch {args.micro} rows, {args.rows // args.micro // args.mini} optimizer steps; the local actor's "
            f"update arithmetic (module docstring); medians of the {len(seconds['frozen'])} alternating reps done "
            f"(of {args.reps}).",
            "",
            "Seconds are " + ("wall clock." if args.measure == "wall" else "the sum of the update's GPU kernel times."),
            "",
            "| mode | MTP sequences trained | s/update | overhead vs frozen |",
            "|---|---|---|---|",
            f"| frozen | - | {result['frozen_s_per_update']:.3f} | - |",
        ]
        for r in rows:
            lines.append(f"| {r['mode']} | {r['fraction']:.0%} | {r['s_per_update']:.3f} | {r['overhead']:+.1%} |")
        (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))

    for rep in range(args.reps):
        order = modes if rep % 2 == 0 else modes[::-1]
        for name, fraction in order:
            seconds[name].append(timed(name != "frozen", fraction))
        print(rep, {k: round(v[-1], 4) for k, v in seconds.items()}, flush=True)
        write_report()


if __name__ == "__main__":
    main()
