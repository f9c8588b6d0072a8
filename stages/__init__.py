"""The stages in order. `import stages.stageN` gives stage N's module; every module has
`attention(q, k, v, *, causal=False, scale=None)` and `INFO` (a lib.inputs.StageInfo)."""
from __future__ import annotations

import importlib

import lib  # noqa: F401  (decides GPU or simulator before any stage imports numba)

NUMBERS = (0, 1, 2, 3, 4, 5, 6)  # registered stages, in order; a new stage adds its number here
# Stages past the forward kernel, with an INFO and a notebook but outside the forward harness
# (lib.bench, the README's table): stage 8's backward, timed by scripts/backward_bench.py.
BEYOND = (8,)
# Stages written and compiled offline but not yet run on a GPU: importable by number (their
# notebook and tests use it), outside the harness and the recorded results until a GPU has
# checked them (then they move to NUMBERS).
DRAFTS = (7,)


def get(n: int):
    """The module of stage n (a forward stage of NUMBERS, one of BEYOND, or a draft)."""
    if n not in NUMBERS + BEYOND + DRAFTS:
        raise ValueError(f"no stage {n}; registered stages are {list(NUMBERS + BEYOND)}"
                         + (f", drafts {list(DRAFTS)}" if DRAFTS else ""))
    return importlib.import_module(f"stages.stage{n}")


def all_stages():
    return [get(n) for n in NUMBERS]
