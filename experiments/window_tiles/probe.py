"""Issue 51: does a 4096-key sliding window at S 32768 D 128 reach 0.9x causal attention's scores
per µs with 128-key tiles instead of stage 6's 176? The record's window row (stage6_variants, H200,
a3c4708) ran 0.899x with D128's default 176-key tiles.

The count behind the question (printed first, no GPU needed): a window call visits every key tile
that holds a visible key of its 128 query rows. Its tiles start at multiples of BLOCK_N from key 0,
so the window's left edge, 4096 keys back, cuts a tile at a different place in each query block;
176-key tiles fill 93.5% of the score slots they visit with visible scores, 128-key tiles 97.0%,
where causal attention's fill 99.1% (176) and 99.6% (128). By the slots alone the window with
128-key tiles would run 0.978x the default causal build's scores per µs, with 176-key tiles 0.943x;
the masked edges' extra work is on top of both. Prediction: 0.92-0.95x with 128-key tiles (three
stages), if they run as fast per slot as 176-key ones (on the H100 they were level at full
attention, faster causal: stages/stage6_variants.py, variant_tiles).

At B1 H16 S32768 bf16, D 128 (and D 64, whose default tiles are already 128 keys, as a check): the
default causal build, and the window with the default tiles and with each 128-key choice, in the
same interleaved rounds; each build's output checked against the float64 reference of the same
window first, at an odd shape.

    python3 experiments/window_tiles/probe.py            # GPU
    python3 experiments/window_tiles/probe.py --count    # the slot count only (no GPU)
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib.reference import visible_scores  # noqa: E402

S, WINDOW, H, B = 32768, 4096, 16, 1
TILES = {128: [None, (128, 3, 2), (128, 2, 2)], 64: [None]}  # None: the launcher's choice


def slot_fill(block_m: int, block_n: int, left: int | None) -> float:
    """Visible scores over the score slots of the key tiles a causal call (with a window of `left`
    keys back, or none) visits: every tile holding a visible key of a block's rows."""
    slots = 0
    for q0 in range(0, S, block_m):
        hi = min(S - 1, q0 + block_m - 1) // block_n
        lo = 0 if left is None else max(0, q0 - left) // block_n
        slots += (hi - lo + 1) * block_n * block_m
    return visible_scores(S, S if left is None else left) / slots


def count():
    for bn in (176, 128):
        c, w = slot_fill(128, bn, None), slot_fill(128, bn, WINDOW)
        print(f"{bn}-key tiles: causal fills {c:.3f} of its slots, window {WINDOW} {w:.3f}; "
              f"window against causal at {bn}: {w / c:.3f}x, against causal at 176: {w / slot_fill(128, 176, None):.3f}x")


def print_rates(t: dict, title: str) -> None:
    """Each timed call's scores per µs against the call named "causal" (full causal attention at
    S): calls named "window…" computed WINDOW's scores, the others S's (also used by
    experiments/window_schedule/probe.py)."""
    full, win = visible_scores(S, S), visible_scores(S, WINDOW)
    rate_c = full / t["causal"].median_us
    print(f"{title}: causal {t['causal'].median_us:,.1f} µs (rounds "
          + " ".join(f"{m:.0f}" for m in t["causal"].round_medians_us) + ")", flush=True)
    for name, r in t.items():
        if name != "causal":
            n = win if name.startswith("window") else full
            print(f"  {name:34s} {r.median_us:9,.1f} µs  {n / r.median_us / rate_c:.3f}x causal's scores per µs "
                  "(rounds " + " ".join(f"{m:.0f}" for m in r.round_medians_us) + ")", flush=True)


def main():
    count()
    if "--count" in sys.argv:
        return 0
    import stages.stage6 as s6
    from lib.inputs import make_qkv
    from lib.reference import check_output
    from lib.timing import time_interleaved
    ok = True
    for D, choices in TILES.items():
        q, k, v = make_qkv(2, 4, 300, D, Sk=517, Hkv=2, dtype=torch.bfloat16)
        for tiles in choices:
            c = check_output(s6.attention(q, k, v, causal=True, window=(97, 0), tiles=tiles), q, k, v,
                             causal=True, window=(97, 0))
            ok &= c.passed
            print(f"D{D} window (97, 0) tiles {tiles or 'default'}: {c.summary()}", flush=True)
        q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
        fns = {"causal": lambda: s6.attention(q, k, v, causal=True)}
        if D == 128:  # causal on the window's 128-key tiles too: is a gain the window's, or the tiles'?
            fns["causal, tiles (128, 3, 2)"] = lambda: s6.attention(q, k, v, causal=True, tiles=(128, 3, 2))
        for tiles in choices:
            fns[f"window, tiles {tiles or 'default'}"] = (lambda tiles=tiles: s6.attention(
                q, k, v, causal=True, window=(WINDOW, 0), tiles=tiles))
        print_rates(time_interleaved(fns, rounds=7, budget_s=0.6), f"D{D} B{B} H{H} S{S}")
        del q, k, v
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
