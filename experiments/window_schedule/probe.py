"""Issue 51: does a sliding window's call run faster per score on a persistent launch? A 4096-key
window at S 32768 runs about 0.90x the default causal build's scores per µs at D 128 (0.899x in
the H200 record, 0.902x in experiments/window_tiles/), and 128-key tiles did not change it
(experiments/window_tiles/README.md), so the tiles' masked slots are not what it loses.

Where else: the causal call's work tiles read 94 key tiles on average (176 keys each), the
window's 25. Stage 6 runs long causal calls on one block per work tile (call_schedule: "causal
with longer keys"), each block with its own start (barriers, Q's copy, the ring's first tiles)
and end; a window's work tiles pay those four times as often per key tile. A persistent launch
(one block per SM walking the work tiles: the next Q copied early, O stored by TMA where two Q
buffers fit) hides them. The window's work tiles are all about as long (but the first 4096 rows'),
as full attention's are, whose rule is persistent blocks at a fixed stride.

At B1 H16 S32768 bf16, causal with a window of 4096 (and the default causal build as the rate
to compare against), D 128 and 64, each schedule and tile choice checked against the float64
reference of a window at an odd shape first, then 7 interleaved rounds.
    python3 experiments/window_schedule/probe.py

`--rule`: the launcher's rule that came of it (stages/stage6.py, WINDOW_SCHEDULES and
WINDOW_TILES) at other shapes, windows and masks, against the launch the same call got before
(what choose() gives the call without its window: the tiles and schedule of a causal or full
call of that length), 5 interleaved rounds; each checked against the float64 reference first.
    python3 experiments/window_schedule/probe.py --rule
"""
import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# the window_tiles probe's report of scores per µs (same S and WINDOW), loaded by path: both files are probe.py
_spec = importlib.util.spec_from_file_location("window_tiles_probe", Path(__file__).parents[1] / "window_tiles" / "probe.py")
_tiles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tiles)
print_rates, S, WINDOW, H, B = _tiles.print_rates, _tiles.S, _tiles.WINDOW, _tiles.H, _tiles.B
P, Q = "+ persistent blocks", "+ work queue"
CHOICES = {  # label: attention() keywords beside window= (None: the launcher's choice)
    128: {"default": {}, "persistent": {"schedule": P}, "queue": {"schedule": Q},
          "persistent, (128, 2, 2)": {"schedule": P, "tiles": (128, 2, 2)},
          "queue, (128, 2, 2)": {"schedule": Q, "tiles": (128, 2, 2)},
          "persistent, (128, 3, 2)": {"schedule": P, "tiles": (128, 3, 2)},
          # three Q buffers and the last P·V carried into the next work tile (carries_pv's rule at short prefill)
          "persistent, (128, 2, 2), 3 Q, carry": {"schedule": P, "tiles": (128, 2, 2), "q_stages": 3, "carry_pv": True}},
    64: {"default": {}, "persistent": {"schedule": P}, "queue": {"schedule": Q},
         "queue without ping-pong": {"schedule": "work queue without ping-pong"}},
}


def main():
    import stages.stage6 as s6
    from lib.inputs import make_qkv
    from lib.reference import check_output
    from lib.timing import time_interleaved
    ok = True
    for D, choices in CHOICES.items():
        q, k, v = make_qkv(2, 4, 1300, D, Sk=1517, Hkv=2, dtype=torch.bfloat16)
        for label, kw in choices.items():
            c = check_output(s6.attention(q, k, v, causal=True, window=(297, 0), **kw), q, k, v,
                             causal=True, window=(297, 0))
            ok &= c.passed
            print(f"D{D} window (297, 0) {label}: {c.summary()}", flush=True)
        q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
        fns = {"causal": lambda: s6.attention(q, k, v, causal=True)}
        for label, kw in choices.items():
            fns[f"window, {label}"] = (lambda kw=kw: s6.attention(q, k, v, causal=True, window=(WINDOW, 0), **kw))
        print_rates(time_interleaved(fns, rounds=7, budget_s=0.6), f"D{D} B{B} H{H} S{S}")
        del q, k, v
    return 0 if ok else 1


RULE_SHAPES = [  # B, H, Hkv, S, D, window, causal
    (4, 32, 8, 8192, 128, (4096, 0), True),     # Mistral-like: a 4096 window at S 8192
    (1, 16, 16, 32768, 128, (1024, 0), True),
    (2, 16, 16, 16384, 128, (2048, 2048), False),  # both sides, no causal mask
    (8, 32, 8, 4096, 128, (1023, 0), True),
    (8, 16, 16, 2048, 64, (512, 0), True),
    (1, 32, 8, 32768, 64, (4096, 0), True),
    (4, 8, 8, 8192, 64, (1024, 1024), False),
]


def rule():
    import stages.stage6 as s6
    from stages.stage6_variants import check_variants
    from lib.inputs import make_qkv
    from lib.reference import check_output
    from lib.timing import time_interleaved
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ok = True
    for B, H, Hkv, S, D, window, causal in RULE_SHAPES:
        q, k, v = make_qkv(B, H, S, D, Hkv=Hkv, dtype=torch.bfloat16)
        now = s6.choose(B, H, Hkv, S, S, D, int(causal), sms, variants=check_variants(q, window=window))
        before = s6.choose(B, H, Hkv, S, S, D, int(causal), sms)
        kw = {"rule": {}, "before": {"tiles": before["tiles"], "schedule": before["schedule"]}}
        qs, ks, vs = q[:1, :, :1000], k[:1, :, :1000], v[:1, :, :1000]
        for name, x in kw.items():
            c = check_output(s6.attention(qs, ks, vs, causal=causal, window=window, **x), qs, ks, vs,
                             causal=causal, window=window)
            ok &= c.passed
            if not c.passed:
                print(f"  {name} FAILED: {c.summary()}")
        fns = {n: (lambda x=x: s6.attention(q, k, v, causal=causal, window=window, **x)) for n, x in kw.items()}
        t = time_interleaved(fns, rounds=5, budget_s=0.4)
        print(f"B{B} H{H}/{Hkv} S{S} D{D} window {window} causal {causal}: rule {now['tiles']} {now['schedule']!r} "
              f"{t['rule'].median_us:,.1f} µs, before {before['tiles']} {before['schedule']!r} "
              f"{t['before'].median_us:,.1f} µs: {t['before'].median_us / t['rule'].median_us:.3f}x", flush=True)
        del q, k, v
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(rule() if "--rule" in sys.argv else main())
