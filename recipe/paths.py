"""Where the project's own files live, anchored to the checkout (never to the working directory), so a command gives
the same answer wherever it is run from."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO_ROOT / "configs"
RESULTS_DIR = REPO_ROOT / "results"
ARTIFACTS_DIR = REPO_ROOT / "artifacts"  # built models and data: the embedded base model, converted real models


def project_path(path: str | Path) -> Path:
    """``path`` as given if absolute, else under the checkout: a config's relative cache or data path names the same
    place from any working directory."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path
