"""What the repository promises a reader: every ``results/...`` path that the code, the configs and the docs name
exists, and results/ stays a set of current claims, not a notebook (its size targets)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# a results path as the sources write it: up to a character that cannot be in one; templates (<name>, {a,b}, *) end it
RESULTS_PATH = re.compile(r"results/[A-Za-z0-9_./-]*[A-Za-z0-9_]")


def sources() -> list[Path]:
    found = [REPO / "README.md", *sorted((REPO / "results").rglob("*.md"))]
    for top in ("recipe", "sam", "mtp", "scripts", "configs"):
        found += sorted(p for p in (REPO / top).rglob("*") if p.suffix in (".py", ".yaml", ".sh", ".sbatch"))
    return found


def named_results_paths() -> list[tuple[str, str]]:
    named = []
    for path in sources():
        text = path.read_text()
        for match in RESULTS_PATH.finditer(text):
            if re.match(
                r"\.?[<{*]", text[match.end() : match.end() + 2]
            ):  # a template: results/ab/<name>/, x.{md,json}
                continue
            named.append((str(path.relative_to(REPO)), match.group().rstrip(".")))
    return named


def test_the_scan_finds_the_readmes_links():
    assert ("README.md", "results/real/rollout_e2e.csv") in named_results_paths()


def test_every_results_path_named_exists():
    missing = sorted({(where, path) for where, path in named_results_paths() if not (REPO / path).exists()})
    assert not missing, missing


def test_results_hold_current_claims_only():
    files = [p for p in (REPO / "results").rglob("*") if p.is_file()]
    assert len(files) <= 150, len(files)
    assert sum(p.stat().st_size for p in files) <= 5 * 2**20
    too_long = [str(p.relative_to(REPO)) for p in files if p.suffix == ".md" and p.stat().st_size > 12 * 1024]
    assert not too_long
    assert (REPO / "results" / "FINDINGS.md").stat().st_size <= 15 * 1024


@pytest.mark.parametrize("name", ["README.md"])
def test_the_readme_stays_short(name):
    assert len((REPO / name).read_text().splitlines()) <= 150


def test_reports_name_the_machine_and_the_commit():
    from recipe.provenance import commit, machine

    assert re.fullmatch(r".+, \d+ cores, .+", machine())
    assert re.fullmatch(r"[0-9a-f]{7,}(\+changes)?|unknown", commit())


def test_every_relative_link_in_the_markdown_resolves():
    broken = []
    for md in [REPO / "README.md", *sorted((REPO / "results").rglob("*.md"))]:
        for match in re.finditer(r"\]\(([^)#:\s]+)\)", md.read_text()):
            if not (md.parent / match.group(1)).exists():
                broken.append((str(md.relative_to(REPO)), match.group(1)))
    assert not broken, broken
