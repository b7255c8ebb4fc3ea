"""recipe/bench/head_acceptance.py: a head that is not an MTP checkpoint is named at start, before any engine starts."""

import argparse
import json
from pathlib import Path

import pytest

from recipe.bench import head_acceptance as mtp_head_acceptance


def test_head_argument_needs_a_checkpoint_with_an_mtp_layer(tmp_path: Path) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected LABEL=CHECKPOINT_DIR"):
        mtp_head_acceptance.parse_head(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="holds no config.json"):
        mtp_head_acceptance.parse_head(f"a={tmp_path}")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(argparse.ArgumentTypeError, match="has no MTP layer"):
        mtp_head_acceptance.parse_head(f"a={tmp_path}")
    (tmp_path / "config.json").write_text(json.dumps({"num_nextn_predict_layers": 1}))
    assert mtp_head_acceptance.parse_head(f"trained head={tmp_path}") == ("trained head", tmp_path)
