"""How far a DAPO run's policy can drift before a frozen MTP head stops being accepted: the drift probe of a run
(recipe/dapo/drift.py: KL from the starting policy and the heads' expected acceptance) measured on saved policy
checkpoints, with the starting head (what a frozen head drafts) and each checkpoint's own head (an online run's).

    python scripts/frozen_head_drift.py --start artifacts/models/smollm2-135m-instruct-mtp \\
        --probe runs/ab/smollm2_drift/mtp_online/drift_probe.json \\
        --policy "rise step 6=runs/spec-rollout-dapo/smollm2-sam-rise/global_step_6/actor" ...

Writes ``<out>/frozen_head_drift.{json,md}``. Every checkpoint must share the starting checkpoint's trunk lineage
(a run started from it, or from the same trunk with another head); the probe is the starting policy's responses
kept by such a run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

DRIFT_KEYS = (
    ("drift/kl_from_start", "KL from start"),
    ("drift/mtp_accept_start_head", "start head, argmax"),
    ("drift/mtp_accept_sampled_start_head", "start head, sampled"),
    ("drift/mtp_accept_head", "own head, argmax"),
    ("drift/mtp_accept_sampled_head", "own head, sampled"),
)


def parse_policy(text: str) -> tuple[str, Path]:
    """``label=checkpoint directory``."""
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"--policy {text!r}: expected LABEL=CHECKPOINT_DIR")
    if not (Path(path) / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"--policy {text!r}: {path} holds no config.json (a checkpoint directory)")
    return label, Path(path)


def main() -> None:
    import torch

    from mtp.checkpoint import load_checkpoint
    from recipe.dapo.drift import DriftProbe

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", type=Path, required=True, help="the starting checkpoint, with the frozen head")
    parser.add_argument("--probe", type=Path, required=True, help="a run's drift_probe.json (the start's responses)")
    parser.add_argument("--policy", type=parse_policy, action="append", required=True, help="LABEL=CHECKPOINT_DIR")
    parser.add_argument("--temperature", type=float, default=1.0, help="the rollout temperature")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "real")
    args = parser.parse_args()
    if not args.probe.is_file():
        parser.error(f"--probe {args.probe}: no such file")
    torch.set_grad_enabled(False)
    sequences = json.loads(args.probe.read_text())
    start = load_checkpoint(args.start)
    probe = DriftProbe(start, sequences, args.temperature)
    rows = [{"policy": "start", "checkpoint": str(args.start), **probe.measure(start)}]
    for label, path in args.policy:
        rows.append({"policy": label, "checkpoint": str(path), **probe.measure(load_checkpoint(path))})
        print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "frozen_head_drift.json").write_text(json.dumps(rows, indent=1))
    command = shlex.join(["python", "scripts/frozen_head_drift.py", *sys.argv[1:]])
    lines = [
        f"Produced by `{command}` ({len(sequences)} probe responses, temperature {args.temperature}). Expected "
        "acceptance of one draft token on the checkpoint's policy, over the probe's response positions: argmax = "
        "the policy's probability of the head's top token; sampled = sum(min(p, q)), a draft sampled from the head.",
        "",
        "| policy | " + " | ".join(name for _, name in DRIFT_KEYS) + " |",
        "|---|" + "---|" * len(DRIFT_KEYS),
    ]
    for row in rows:
        lines.append(f"| {row['policy']} | " + " | ".join(f"{row[key]:.3f}" for key, _ in DRIFT_KEYS) + " |")
    (args.out / "frozen_head_drift.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
