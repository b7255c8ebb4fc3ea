"""Re-draw ``timelines.png`` of a head swap from its saved ``timelines.json.gz`` (scripts/frozen_head_drift.py writes
both): each policy's first pair of rollouts, active requests and engine step durations, the prefill steps marked.

    python scripts/plot_swap_timelines.py results/real/online_vs_frozen_1129/swap_k1_decode_step8 ...
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recipe.ab.render import swap_timelines_plot  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", type=Path, nargs="+", help="--out folders of scripts/frozen_head_drift.py")
    args = parser.parse_args()
    for folder in args.folders:
        saved = folder / "timelines.json.gz"
        if not saved.is_file():
            parser.error(f"{saved}: no such file (a swap run before 2026-11-29's timelines, or not a swap's folder)")
        with gzip.open(saved, "rt") as fh:
            swap_timelines_plot(json.load(fh), folder / "timelines.png")
        print(folder / "timelines.png")


if __name__ == "__main__":
    main()
