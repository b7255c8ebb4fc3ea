"""The step-cost model (recipe/cost_model.py) fitted to measured tables and checked where it was not fitted
-> ``results/cost_model/validation.csv`` (``table, cell, measured, predicted, fitted``), ``validation.png`` and
``fits.json``.

- ``h200-smollm2``: SmolLM2-135M's decode/verify step on an H200 as a CUDA graph, context 320
  (results/real/verify_cost/verify_cost_gpu.json), every cell fitted;
- ``paper-7b``: the verification cost of seven draft tokens over a plain step for Qwen2.5-7B by batch size, as
  quoted in issue #94 from EfficientRollout (arXiv 2606.18967), predicted from the H200 fit carried to Qwen2.5-7B's
  shape on ``--paper-device`` at ``--paper-context``: never fitted;
- ``cpu-smollm2``: SmolLM2-135M in float32 in a vLLM CPU engine on 2 cores (results/real/verify_cost/
  verify_cost.json: the test prompts and 384-token prompts), fitted on the batches of ``--cpu-fit-batches`` at every
  context, the other batches held out, and the steps with its MTP head drafting (``K=mtp``), priced by
  :func:`recipe.cost_model.head_seconds`, never fitted;
- ``<gpu>-<shape>``: a table ``recipe.bench verify-cost --gpu --shape qwen3-8b --out results/cost_model`` measured
  (``--gpu-table``), predicted from the H200 fit on its device's data sheet: never fitted. Absent until a GPU ran it.

    python -m recipe.bench cost-model

``predict`` prices a user's own steps from the same carried fit: ``cells.csv`` has the columns ``gpu, model, tp,
batch, context, k`` (``model`` a built-in shape or the path of a Hugging Face ``config.json``; ``k`` the draft
tokens per request, 0 for a plain decode step); ``pred.csv`` repeats them in order with ``seconds`` added. A bad row
is named in one line (exit 2).

    python -m recipe.bench cost-model predict --cells cells.csv --out pred.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

from recipe.cost_model import (
    CELL_COLUMNS,
    DEVICES,
    SHAPES,
    Cell,
    cell_errors,
    device_named,
    fit,
    max_abs_error,
    predict_step,
)
from recipe.paths import RESULTS_DIR

MEASURED = RESULTS_DIR / "real" / "verify_cost"
# seven draft tokens over a plain step, Qwen2.5-7B, by batch size: the figures issue #94 quotes from EfficientRollout
PAPER_7B_K7 = {1: 1.06, 8: 1.30, 16: 1.35, 32: 1.70, 64: 2.70}


def gpu_cells(rows: list[dict], table: str) -> list[Cell]:
    """A verify-cost --gpu table's steps: each batch and context's plain step and every K's verify step, seconds."""
    context = {(r["batch"], r.get("context", 320)) for r in rows}  # the table before --contexts held 320 only
    plain = {(r["batch"], r.get("context", 320)): r["plain_ms"] for r in rows}
    cells = [Cell(table, b, 0, float(c), plain[b, c] / 1e3) for b, c in sorted(context)]
    return cells + [Cell(table, r["batch"], r["k"], float(r.get("context", 320)), r["step_ms"] / 1e3) for r in rows]


def h200_cells() -> list[Cell]:
    return gpu_cells(json.loads((MEASURED / "verify_cost_gpu.json").read_text())["rows"], "h200-smollm2")


def cpu_cells() -> list[Cell]:
    """The CPU table's uniform steps (every request drafting K tokens, or none, or the MTP head's one), each at its
    measured context; "1of" (one request of the batch drafts) is not a uniform step."""
    cells = []
    for s in json.loads((MEASURED / "verify_cost.json").read_text())["steps"]:
        if s["k"] != "1of":
            head = s["k"] == "mtp"
            seconds = float(np.median(s["ms"])) / 1e3
            cells.append(Cell("cpu-smollm2", s["batch"], 1 if head else int(s["k"]), s["context"], seconds, head=head))
    return sorted(cells, key=lambda c: (c.context, c.batch, c.head, c.k))


def plot(rows: list[dict], path: Path) -> None:
    """Each cell's prediction error, by table: fitted cells filled, held-out ones hollow, the 15% goal shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = list(dict.fromkeys(r["table"] for r in rows))
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    ax.axhspan(-15, 15, color="grey", alpha=0.12, label="within 15%")
    ax.axhline(0, color="grey", lw=0.8)
    rng = np.random.default_rng(0)
    for i, table in enumerate(tables):
        for fitted, offset in (("yes", -0.15), ("no", 0.15)):
            errors = [100 * r["error"] for r in rows if r["table"] == table and r["fitted"] == fitted]
            if errors:
                x = i + offset + rng.uniform(-0.08, 0.08, len(errors))
                face = f"C{i}" if fitted == "yes" else "none"
                label = "fitted" if fitted == "yes" else "held out"
                ax.scatter(x, errors, s=16, edgecolors=f"C{i}", facecolors=face, label=f"{table}, {label}")
    ax.set_xticks(range(len(tables)), tables)
    ax.set(ylabel="predicted / measured - 1 (%)", title="The step-cost model against measured steps, every cell")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def predict(argv: list[str]) -> None:
    """``cost-model predict``: each row of ``--cells`` priced (:func:`recipe.cost_model.predict_step`)."""
    import pandas as pd

    parser = argparse.ArgumentParser(prog="python -m recipe.bench cost-model predict", description=predict.__doc__)
    parser.add_argument("--cells", type=Path, required=True, help=f"CSV with the columns {', '.join(CELL_COLUMNS)}")
    parser.add_argument("--out", type=Path, required=True, help="CSV: the cells in order, with seconds added")
    args = parser.parse_args(argv)
    if not args.cells.is_file():
        parser.exit(2, f"error: --cells {args.cells}: no such file\n")
    cells = pd.read_csv(args.cells, dtype=str, keep_default_na=False)
    missing = [c for c in CELL_COLUMNS if c not in cells.columns]
    if missing:
        parser.exit(2, f"error: --cells {args.cells}: missing column(s) {', '.join(missing)}\n")
    seconds = []
    for line, row in enumerate(cells.itertuples(index=False), start=2):  # the header is line 1
        try:
            values = {c: getattr(row, c).strip() for c in CELL_COLUMNS}
            numbers = {}
            for column, kind in (("tp", int), ("batch", int), ("k", int), ("context", float)):
                try:
                    numbers[column] = kind(values[column])
                except ValueError:
                    raise ValueError(
                        f"{column} {values[column]!r}: not {'an integer' if kind is int else 'a number'}"
                    ) from None
            seconds.append(predict_step(values["gpu"], values["model"], **numbers))
        except ValueError as err:
            parser.exit(2, f"error: --cells {args.cells}, line {line}: {err}\n")
    cells["seconds"] = [f"{s:.6g}" for s in seconds]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cells.to_csv(args.out, index=False)
    print(f"{len(cells)} steps priced -> {args.out}")


def main() -> None:
    if sys.argv[1:2] == ["predict"]:
        return predict(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paper-device", default="h100", choices=sorted(DEVICES))
    parser.add_argument("--paper-context", type=float, default=2048.0, help="KV tokens per request in the paper cells")
    parser.add_argument("--cpu-fit-batches", default="1,8,64", help="CPU batches fitted; the rest are held out")
    parser.add_argument(
        "--gpu-table",
        type=Path,
        default=RESULTS_DIR / "cost_model" / "verify_cost_gpu.json",
        help="a verify-cost --gpu table of another shape, predicted from the H200 fit (skipped where absent)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "cost_model")
    args = parser.parse_args()
    try:
        cpu_fit_batches = {int(b) for b in args.cpu_fit_batches.split(",")}
    except ValueError:
        parser.error(f"--cpu-fit-batches: comma-separated integers, got {args.cpu_fit_batches!r}")

    smollm2, gpu = SHAPES["smollm2-135m"], DEVICES["h200"]
    h200 = h200_cells()
    gpu_fit = fit(h200, smollm2, gpu)
    paper = [Cell("paper-7b", b, 7, args.paper_context, r, relative=True) for b, r in PAPER_7B_K7.items()]
    paper_rows = cell_errors(paper, SHAPES["qwen2.5-7b"], DEVICES[args.paper_device], gpu_fit)

    cpu_shape, cpu = SHAPES["smollm2-135m-fp32"], DEVICES["cpu-2core"]
    cpu_all = cpu_cells()
    cpu_fitted = [c.batch in cpu_fit_batches and not c.head for c in cpu_all]  # the head's cells: never fitted
    cpu_fit = fit([c for c, fitted_ in zip(cpu_all, cpu_fitted, strict=True) if fitted_], cpu_shape, cpu)
    cpu_rows = cell_errors(cpu_all, cpu_shape, cpu, cpu_fit)

    measured_gpu = []
    if args.gpu_table.is_file():
        table = json.loads(args.gpu_table.read_text())
        device = device_named(table["device"])
        if device is None:
            parser.error(f"--gpu-table {args.gpu_table}: no data sheet for device {table['device']!r}")
        name = f"{device.name}-{table['shape']}"
        cells = gpu_cells(table["rows"], name)
        measured_gpu = cell_errors(cells, SHAPES[table["shape"]], device, gpu_fit)
    rows = [
        *({**r, "fitted": "yes"} for r in cell_errors(h200, smollm2, gpu, gpu_fit)),
        *({**r, "fitted": "no"} for r in paper_rows),
        *({**r, "fitted": "no"} for r in measured_gpu),
        *({**r, "fitted": "yes" if f else "no"} for r, f in zip(cpu_rows, cpu_fitted, strict=True)),
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "validation.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["table", "cell", "measured", "predicted", "fitted", "error"])
        writer.writeheader()
        writer.writerows({**r, "measured": f"{r['measured']:.6g}", "predicted": f"{r['predicted']:.6g}",
                          "error": f"{r['error']:+.3f}"} for r in rows)  # fmt: skip
    plot(rows, args.out / "validation.png")
    summary = {
        "h200": gpu_fit.as_dict(),
        "cpu-2core": cpu_fit.as_dict(),
        "paper_device": args.paper_device,
        "paper_context": args.paper_context,
        "max_abs_error": {
            f"{table}, fitted={fitted}": max_abs_error(
                [r for r in rows if r["table"] == table and r["fitted"] == fitted]
            )
            for table in dict.fromkeys(r["table"] for r in rows)
            for fitted in ("yes", "no")
            if any(r["table"] == table and r["fitted"] == fitted for r in rows)
        },
    }
    (args.out / "fits.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    for r in rows:
        if r["table"] != "h200-smollm2":
            print(f"{r['table']:13s} {r['cell']:10s} measured {r['measured']:.4g} predicted {r['predicted']:.4g} "
                  f"({r['error']:+.1%}) fitted {r['fitted']}")  # fmt: skip


if __name__ == "__main__":
    main()
