"""``python -m recipe.bench NAME [options]``: run one benchmark (``--help`` lists them; ``NAME --help`` its options)."""

from __future__ import annotations

import importlib
import sys

from recipe.bench import BENCHMARKS


def usage() -> str:
    width = max(map(len, BENCHMARKS))
    rows = "\n".join(f"  {name:<{width}}  {line}" for name, (_, line) in BENCHMARKS.items())
    return f"usage: python -m recipe.bench NAME [options]\n\nbenchmarks (each writes its results folder):\n{rows}\n"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage(), end="")
        return
    name, rest = args[0], args[1:]
    if name not in BENCHMARKS:
        print(f"error: unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
        raise SystemExit(2)
    module = importlib.import_module(f"recipe.bench.{BENCHMARKS[name][0]}")
    sys.argv = [f"python -m recipe.bench {name}", *rest]  # each benchmark parses its own options
    module.main()


if __name__ == "__main__":
    main()
