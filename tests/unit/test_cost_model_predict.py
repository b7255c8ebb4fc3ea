"""``python -m recipe.bench cost-model predict``: a user's own steps priced from the carried fit, row by row in their
order, a bad row named in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from recipe.cost_model import DEVICES, GPU_FIT, SHAPES, predict_step, shape_from_config, step_seconds, tensor_parallel

QWEN3_8B = {"num_hidden_layers": 36, "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936}  # fmt: skip


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipe.bench", "cost-model", "predict", *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_each_cell_is_priced_in_order_from_a_built_in_shape_or_a_config_json(tmp_path):
    config = tmp_path / "my-model" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(QWEN3_8B))
    cells = pd.DataFrame(
        [
            ("h100", "qwen3-8b", 1, 16, 2048, 4),
            ("h100", "qwen3-8b", 1, 16, 2048, 0),
            ("a100", str(config), 2, 1, 300, 7),
        ],
        columns=["gpu", "model", "tp", "batch", "context", "k"],
    )
    cells.to_csv(tmp_path / "cells.csv", index=False)
    done = run("--cells", str(tmp_path / "cells.csv"), "--out", str(tmp_path / "pred.csv"))
    assert done.returncode == 0, done.stderr
    pred = pd.read_csv(tmp_path / "pred.csv")
    assert pred[list(cells.columns)].astype(str).equals(cells.astype(str))  # the cells, as given, in order
    expected = [
        step_seconds(SHAPES["qwen3-8b"], DEVICES["h100"], GPU_FIT, 16, 2048, 4),
        step_seconds(SHAPES["qwen3-8b"], DEVICES["h100"], GPU_FIT, 16, 2048, 0),
        step_seconds(shape_from_config("my-model", QWEN3_8B), tensor_parallel(DEVICES["a100"], 2), GPU_FIT, 1, 300, 7),
    ]
    assert pred["seconds"].tolist() == pytest.approx(expected, rel=1e-5)
    assert pred["seconds"][0] > pred["seconds"][1]  # verifying drafts costs the step something


def test_a_config_without_head_dim_or_kv_heads_takes_transformers_defaults():
    config = {k: v for k, v in QWEN3_8B.items() if k not in ("head_dim", "num_key_value_heads")}
    shape = shape_from_config("m", config)
    assert shape.head_dim == 4096 // 32 and shape.kv_heads == 32


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("v100,qwen3-8b,1,16,2048,0", "line 2: gpu 'v100': no data sheet here (known: a100, h100, h200)"),
        ("cpu-2core,qwen3-8b,1,16,2048,0", "line 2: gpu 'cpu-2core': no data sheet here"),
        ("h100,llama-9b,1,16,2048,0", "line 2: model 'llama-9b': neither a built-in shape"),
        ("h100,qwen3-8b,1,16.5,2048,0", "line 2: batch '16.5': not an integer"),
        ("h100,qwen3-8b,1,16,2048,-1", "line 2: k -1: an integer >= 0"),
        ("h100,qwen3-8b,1,16,lots,0", "line 2: context 'lots': not a number"),
    ],
)
def test_a_bad_row_is_named_in_one_line_and_exit_2(tmp_path, row, message):
    (tmp_path / "cells.csv").write_text(f"gpu,model,tp,batch,context,k\n{row}\n")
    done = run("--cells", str(tmp_path / "cells.csv"), "--out", str(tmp_path / "pred.csv"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert message in done.stderr and not (tmp_path / "pred.csv").exists()


def test_a_missing_column_is_named(tmp_path):
    (tmp_path / "cells.csv").write_text("gpu,model,batch,context,k\nh100,qwen3-8b,16,2048,0\n")
    done = run("--cells", str(tmp_path / "cells.csv"), "--out", str(tmp_path / "pred.csv"))
    assert done.returncode == 2 and "missing column(s) tp" in done.stderr


def test_the_function_refuses_what_the_command_refuses():
    with pytest.raises(ValueError, match="tp 0"):
        predict_step("h100", "qwen3-8b", 0, 16, 2048, 0)
