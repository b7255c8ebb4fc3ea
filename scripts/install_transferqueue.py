"""Install TransferQueue, which veRL 0.9.1's V1 trainer imports, without its extra top-level packages.

Its wheel ships ``recipe/``, ``tests/``, ``scripts/`` and ``tutorial/`` next to ``transfer_queue/``; a
top-level ``recipe`` in site-packages shadows this project's package. It is installed with ``--no-deps``
(its requirements are already veRL's) and every file it put outside ``transfer_queue`` is removed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

PIN = "transferqueue==0.1.11"
KEEP = ("transfer_queue", "transferqueue-")


def main() -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", PIN], check=True)
    dist = metadata.distribution("transferqueue")
    removed = 0
    for f in dist.files or []:
        if f.parts[0].startswith(KEEP):
            continue
        path = Path(dist.locate_file(f))
        if path.is_file():
            path.unlink()
            removed += 1
    site = Path(dist.locate_file(""))
    for top in ("recipe", "tutorial"):  # left empty (but for bytecode caches) by the removal above
        d = site / top
        if d.is_dir() and not any(f.is_file() and "__pycache__" not in f.parts for f in d.rglob("*")):
            shutil.rmtree(d)
    print(f"{PIN}: removed {removed} files outside transfer_queue/")


if __name__ == "__main__":
    main()
