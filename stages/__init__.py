"""The stages in order. `import stages.stageN` gives stage N's module; every module has
`attention(q, k, v, *, causal=False, scale=None, attn_mask=None)` (SDPA's `is_causal` and
`enable_gqa` taken too) and `INFO` (a lib.inputs.StageInfo). A stage's attention() is its
forward alone; `stages.autograd.attention(q, k, v, forward=5 or 6)` adds stage 8's backward."""
from __future__ import annotations

import importlib

import lib  # noqa: F401  (decides GPU or simulator before any stage imports numba)

NUMBERS = (0, 1, 2, 3, 4, 5, 6)  # registered stages, in order; a new stage adds its number here
# Stages past the 16-bit forward kernel, with an INFO, tests and a notebook but outside the
# forward harness (lib.bench, the README's table, whose error rule is the 16-bit one): stage 7's
# FP8 forward (its own rule, lib.fp8; timed and recorded by scripts/fp8_bench.py) and stage 8's
# backward (scripts/backward_bench.py).
BEYOND = (7, 8)


def get(n: int):
    """The module of stage n (a forward stage of NUMBERS or one of BEYOND)."""
    if n not in NUMBERS + BEYOND:
        raise ValueError(f"no stage {n}; registered stages are {list(NUMBERS + BEYOND)}")
    return importlib.import_module(f"stages.stage{n}")


def all_stages():
    return [get(n) for n in NUMBERS]
