"""``python -m recipe.sft [overrides]``: build (or reuse) the base model for the embedded task."""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from recipe.paths import CONFIG_DIR
from recipe.sft.train import ensure_base_model


@hydra.main(config_path=str(CONFIG_DIR), config_name="sft", version_base=None)
def main(cfg: DictConfig) -> None:
    logging.basicConfig(level=logging.INFO)
    ckpt = ensure_base_model(cfg)
    print(f"base model: {ckpt}")


if __name__ == "__main__":
    main()
