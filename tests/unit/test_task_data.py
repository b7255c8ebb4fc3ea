"""The embedded task: schema, determinism, correctness of reference traces, heavy tail, bad rows."""

import warnings

import numpy as np
import pandas as pd
import pytest

from recipe.data.loader import DatasetFormatWarning, load_problems
from recipe.data.task import TaskConfig, generate_rows, length_stats, solution_text, write_splits
from recipe.evaluate import score_response


def test_solution_trace_shape():
    assert solution_text([3, 8, 7, 1]) == "= 3 8 7 1\n= 11 7 1\n= 18 1\n= 19\nAnswer: 19"


def test_rows_follow_dapo_math_schema():
    row = generate_rows(1, seed=0, split="train")[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["prompt"][0]["role"] == "user"
    assert row["reward_model"]["style"] == "rule"


def test_reference_solutions_score_correct_with_verl_math_dapo():
    for row in generate_rows(200, seed=1, split="train"):
        truth = row["reward_model"]["ground_truth"]
        assert score_response(row["extra_info"]["solution"], truth)["acc"]
        assert not score_response(row["extra_info"]["solution"] + "0", truth)["acc"]


def test_generation_is_deterministic_and_seed_dependent():
    a, b, c = (generate_rows(50, seed=s, split="train") for s in (7, 7, 8))
    assert a == b
    assert a != c


def test_length_distribution_is_heavy_tailed():
    lengths = [len(r["extra_info"]["solution"]) for r in generate_rows(5000, seed=0, split="train")]
    stats = length_stats(lengths)
    assert stats["p99"] > 8 * stats["p50"]
    assert stats["max"] <= len(solution_text([9] * TaskConfig().max_terms))


def test_splits_are_disjoint_and_reloadable(tmp_path):
    paths = write_splits(tmp_path, num_train=300, num_test=50, seed=0)
    train, test = load_problems(paths["train"]), load_problems(paths["test"])
    assert len(train) == 300 and len(test) == 50
    assert not {p.messages[0]["content"] for p in train} & {p.messages[0]["content"] for p in test}


def test_malformed_rows_are_skipped_and_counted(tmp_path):
    rows = generate_rows(5, seed=0, split="train")
    rows[1]["reward_model"] = {"style": "rule", "ground_truth": ""}
    rows[3]["prompt"] = []
    path = tmp_path / "bad.parquet"
    pd.DataFrame(rows).to_parquet(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        problems = load_problems(path)
    assert [p.index for p in problems] == [0, 2, 4]
    messages = [str(w.message) for w in caught if issubclass(w.category, DatasetFormatWarning)]
    assert len(messages) == 1 and "skipped 2 of 5 rows" in messages[0]
    assert "missing reward_model.ground_truth" in messages[0] and "missing prompt" in messages[0]


def test_missing_data_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        load_problems(tmp_path / "nope.parquet")


def test_a_file_that_is_not_parquet_or_lacks_the_schemas_columns_is_named_with_what_it_needs(tmp_path):
    from recipe.data.loader import DataFileError, check_data_file

    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"not a parquet file")
    with pytest.raises(DataFileError, match=r"data.val_files: .*corrupt.parquet is not a readable parquet file"):
        check_data_file(corrupt, "data.val_files")
    other = tmp_path / "gsm8k.parquet"
    pd.DataFrame({"question": ["1+1?"], "answer": ["2"]}).to_parquet(other)
    with pytest.raises(DataFileError, match=r"gsm8k.parquet has no column prompt, reward_model .*'question'") as err:
        load_problems(other)
    assert "DAPO-Math-17k's schema" in str(err.value)


def test_tokenizer_round_trips_and_loads_with_autotokenizer(tmp_path):
    from transformers import AutoTokenizer

    from mtp.checkpoint import save_tokenizer
    from recipe.data.tokenizer import train_tokenizer

    rows = generate_rows(500, seed=0, split="train")
    texts = [r["extra_info"]["solution"] for r in rows] + [r["prompt"][0]["content"] for r in rows]
    trained = train_tokenizer(texts, vocab_size=300)
    save_tokenizer(trained, tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    for text in texts[:50]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == trained(text, add_special_tokens=False)["input_ids"]  # loads as it was trained
        assert tok.decode(ids) == text
    digits = tok.convert_ids_to_tokens(tok("1234 56", add_special_tokens=False)["input_ids"])
    assert digits == ["1", "2", "3", "4", "Ġ5", "6"]
    chat = tok.apply_chat_template(rows[0]["prompt"], add_generation_prompt=True, tokenize=False)
    assert chat.endswith("<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and np.isscalar(tok.eos_token_id)
