"""SAM: suffix-automaton drafting. Submodules import numba; the package itself does not (sam.runner_hook is loaded
into every vLLM worker before its kernels are set up)."""
