"""``python -m recipe.bench NAME [--gpu] [options]``: run one benchmark (``--help`` lists them; ``NAME --help`` its
options; ``--gpu`` the torch-only GPU twin where one exists)."""

from __future__ import annotations

import importlib
import sys

from recipe.bench import BENCHMARKS, GPU_FLAG


def usage() -> str:
    width = max(map(len, BENCHMARKS))
    rows = "\n".join(f"  {name:<{width}}  {b.line}" for name, b in BENCHMARKS.items())
    return f"usage: python -m recipe.bench NAME [--gpu] [options]\n\nbenchmarks (each writes its results folder):\n{rows}\n"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage(), end="")
        return
    name, rest = args[0], args[1:]
    if name not in BENCHMARKS:
        print(f"error: unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
        raise SystemExit(2)
    bench = BENCHMARKS[name]
    module = bench.module
    if GPU_FLAG in rest:
        if bench.gpu_module is None:
            print(f"error: {name} has no {GPU_FLAG} twin; those that do: "
                  f"{', '.join(n for n, b in BENCHMARKS.items() if b.gpu_module)}", file=sys.stderr)  # fmt: skip
            raise SystemExit(2)
        module, rest = bench.gpu_module, [a for a in rest if a != GPU_FLAG]
        name = f"{name} {GPU_FLAG}"
    sys.argv = [f"python -m recipe.bench {name}", *rest]  # each benchmark parses its own options
    importlib.import_module(f"recipe.bench.{module}").main()


if __name__ == "__main__":
    main()
