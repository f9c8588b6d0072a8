"""Issue 48: in the training map's slow rounds, which part of a step grew: the GPU's forward or
backward, or the host's launching of them (the GPU then waiting)? At the four S 512 D 64 rows
(B32 H16, Hkv 16 and 4, full and causal, bf16; scripts/backward_bench.py's train_shapes), after
one gradient check per row (backward_bench.check_train_step), both sides' steps (stage 6 + 8's
through stages.autograd, SDPA default's) run in interleaved rounds as the map runs them (each
side warmed up by lib.timing's own preparation, each batch after the map's untimed settle runs,
the L2 flushed before each step, the GPU not held; as many steps a round as the map's rounds get
at the row). For every step it records:
  - host times (time.perf_counter) before the forward call, after it returns and after
    .backward() returns: the host's enqueue time of the forward and of the backward;
  - CUDA events on the current stream before the L2 flush, before the forward, between forward
    and backward and after the backward: the GPU time of the forward, the backward and the step
    (the last the map's event pair), and, against an event recorded right after a synchronize
    at the start of each batch, how long after the host queued an event the GPU reached it
    ("GPU lag"; about 0 when the GPU had run all the host had queued, i.e. was waiting for it:
    an event pair then also times that waiting, not kernels only);
  - once a batch, as its last step is queued, the SM clock and the power drawn (pynvml, through
    torch.cuda.clock_rate and torch.cuda.power_draw; "n/a" without it).
Each row and side prints its rounds' medians, a round slower than SLOW times the side's fastest
round marked SLOW; at the end, per row and side, slow rounds against fast: the extra step time,
the part of it in the GPU's forward and backward event times, the host's enqueue times, host
enqueue minus GPU time a step, and the GPU's lag.

    python3 experiments/train_step_rounds/probe_phases.py [--rounds N]
"""
import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "scripts")]
from backward_bench import (SDPA_STEP, STAGE_STEP, TRAIN_BUDGET_S, TRAIN_MAX_RUNS, TRAIN_MIN_RUNS,  # noqa: E402
                            TRAIN_ROUNDS, check_train_step, leaves, train_shapes, train_step_call)
from lib.inputs import make_qkv  # noqa: E402
from lib.timing import SETTLE_MS, flush_l2, sdpa_call, settle_runs  # noqa: E402
from lib.timing import _prepare, _timed_runs  # noqa: E402  (the map's own warm-up and settle runs)
from stages import autograd  # noqa: E402

SLOW = 1.15  # a round whose median step exceeds this times the row and side's fastest round
# per step, µs: GPU (events) step, forward, backward; host enqueue step, forward, backward; GPU lag
# at the step's start (before the L2 flush) and end (after the backward); host enqueue minus GPU step
FIELDS = ("step", "fwd", "bwd", "host_step", "host_fwd", "host_bwd", "lag_start", "lag_end", "host_gap")


def clock_power() -> tuple:
    """(SM clock in MHz, power in W), each None where pynvml (or the query) is missing."""
    out = []
    for query, unit in ((torch.cuda.clock_rate, 1.0), (torch.cuda.power_draw, 1e-3)):  # power_draw: mW
        try:
            out.append(query() * unit)
        except Exception:  # pynvml not installed, or NVML refused
            out.append(None)
    return tuple(out)


def timed_batch(forward, inputs: list, dout, steps: int) -> dict:
    """`steps` training steps (the L2 flushed before each, gradients set to None, forward(), then
    .backward(dout)) back to back, the host stamping and the GPU recording events around each part;
    one synchronize at the end. {field: [µs per step]} plus the clock and power read after the last
    step is queued."""
    ev = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(steps)]
    host = [[0.0] * 4 for _ in range(steps)]
    anchor = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t_anchor = time.perf_counter()
    anchor.record()
    for e, h in zip(ev, host):
        h[0] = time.perf_counter()
        e[0].record()
        flush_l2()
        for t in inputs:
            t.grad = None
        h[1] = time.perf_counter()
        e[1].record()
        out = forward()
        h[2] = time.perf_counter()
        e[2].record()
        out.backward(dout)
        h[3] = time.perf_counter()
        e[3].record()
    clock, power = clock_power()
    torch.cuda.synchronize()
    res = {f: [] for f in FIELDS}
    for e, h in zip(ev, host):
        g = [anchor.elapsed_time(x) * 1e3 for x in e]  # µs after the anchor, on the GPU
        h = [(x - t_anchor) * 1e6 for x in h]          # µs after the anchor, on the host
        for f, x in zip(FIELDS, (g[3] - g[1], g[2] - g[1], g[3] - g[2], h[3] - h[1], h[2] - h[1], h[3] - h[2],
                                 g[0] - h[0], g[3] - h[3], (h[3] - h[1]) - (g[3] - g[1]))):
            res[f].append(x)
    return {"clock": clock, "power": power, **res}


def measure(shape: dict, rounds: int) -> dict:
    """{side: [per round: {field: median over its steps}, clock, power]} for one row."""
    B, H, Hkv, S, D, causal = (shape[x] for x in ("B", "H", "Hkv", "S", "D", "causal"))
    q, k, v = make_qkv(B, H, S, D, Hkv=Hkv, dtype=getattr(torch, shape["dtype"]))
    dout = torch.randn_like(q)
    ours, theirs = leaves(q, k, v), leaves(q, k, v)
    sides = {STAGE_STEP: (lambda: autograd.attention(*ours, forward=6, causal=causal), ours),
             SDPA_STEP: (sdpa_call(*theirs, causal=causal), theirs)}
    sides = {n: s for n, s in sides.items() if s[0] is not None}
    plan = {}
    for name, (forward, inputs) in sides.items():  # as time_interleaved: both sides prepared first
        runs, _, probe_s = _prepare(train_step_call(forward, inputs, dout), warmup=2, min_runs=TRAIN_MIN_RUNS,
                                    max_runs=TRAIN_MAX_RUNS, budget_s=TRAIN_BUDGET_S, flush=True, hold=False)
        plan[name] = (math.ceil(runs / TRAIN_ROUNDS), settle_runs(probe_s, SETTLE_MS))
    names, got = list(sides), {name: [] for name in sides}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:  # each round one side further on
            forward, inputs = sides[name]
            steps, settle = plan[name]
            if settle:
                _timed_runs(train_step_call(forward, inputs, dout), settle, True)  # untimed, as the map's
            b = timed_batch(forward, inputs, dout, steps)
            got[name].append({**{f: statistics.median(b[f]) for f in FIELDS}, "clock": b["clock"],
                              "power": b["power"], "steps": steps})
    return got


def fmt(x, spec: str = ".0f", unit: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{unit}"


def round_line(i: int, r: dict, slow: bool) -> str:
    return (f"    round {i + 1:2d}: step {r['step']:6.1f} µs (fwd {r['fwd']:6.1f}, bwd {r['bwd']:6.1f}); host enqueue "
            f"{r['host_step']:6.1f} (fwd {r['host_fwd']:6.1f}, bwd {r['host_bwd']:6.1f}); GPU lag start "
            f"{r['lag_start']:6.1f}, end {r['lag_end']:6.1f}; {fmt(r['clock'], '.0f', ' MHz')}, "
            f"{fmt(r['power'], '.0f', ' W')}{'  SLOW' if slow else ''}")


def middle(rows: list, field: str):
    got = [r[field] for r in rows if r[field] is not None]
    return statistics.median(got) if got else None


def summary(label: str, side: str, rounds: list) -> list:
    """Slow rounds against fast ones, medians over each group's round medians."""
    fastest = min(r["step"] for r in rounds)
    slow = [r for r in rounds if r["step"] > SLOW * fastest]
    fast = [r for r in rounds if r["step"] <= SLOW * fastest]
    if not slow:
        return [f"{label}, {side}: no slow round of {len(rounds)} (slowest "
                f"{max(r['step'] for r in rounds) / fastest:.2f}x the fastest)"]
    m = {f: (middle(fast, f), middle(slow, f)) for f in (*FIELDS, "clock", "power")}
    d = {f: m[f][1] - m[f][0] for f in FIELDS}
    return [f"{label}, {side}: {len(slow)} slow round{'s' if len(slow) > 1 else ''} of {len(rounds)}, step "
            f"{m['step'][1]:.1f} µs against {m['step'][0]:.1f} in the fast ones: {d['step']:+.1f} µs",
            f"    (a) GPU event time: forward {d['fwd']:+.1f} µs, backward {d['bwd']:+.1f} µs",
            f"    (b) host enqueue: forward {d['host_fwd']:+.1f} µs, backward {d['host_bwd']:+.1f} µs; host enqueue "
            f"- GPU time a step: fast {m['host_gap'][0]:+.1f} µs, slow {m['host_gap'][1]:+.1f} µs",
            f"    GPU lag at a step's start: fast {m['lag_start'][0]:.1f} µs, slow {m['lag_start'][1]:.1f}; at its "
            f"end: fast {m['lag_end'][0]:.1f}, slow {m['lag_end'][1]:.1f}; clock fast "
            f"{fmt(m['clock'][0], '.0f', ' MHz')}, slow {fmt(m['clock'][1], '.0f', ' MHz')}; power fast "
            f"{fmt(m['power'][0], '.0f', ' W')}, slow {fmt(m['power'][1], '.0f', ' W')}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds a row (default 15)")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: times stage 6 + 8's training step (sm_90a), so it needs an H100 or H200 "
                   "and none was found\n")
    shapes = [s for s in train_shapes() if s["S"] == 512 and s["D"] == 64]
    clock, power = clock_power()  # NVML's start-up, before anything is timed
    print(f"{torch.cuda.get_device_name()}: SM clock {fmt(clock, '.0f', ' MHz')}, power {fmt(power, '.0f', ' W')} "
          f"at rest; {a.rounds} rounds a row, a round slower than {SLOW}x its side's fastest marked SLOW", flush=True)
    t0, results, failed = time.time(), [], False
    for i, shape in enumerate(shapes):
        label = (f"B{shape['B']} H{shape['H']}/{shape['Hkv']} S{shape['S']} D{shape['D']} "
                 f"{'causal' if shape['causal'] else 'full'}")
        checks = check_train_step(*(shape[x] for x in ("H", "Hkv", "S", "D", "causal")),
                                  getattr(torch, shape["dtype"]), torch.randint(0, 2**31 - 1, ()).item())
        worst = max(c.max_abs_err / c.tolerance for c in checks.values())
        passed = all(c.passed for c in checks.values())
        print(f"[{i + 1}/{len(shapes)}, {time.time() - t0:5.1f} s] {label}: gradients {'pass' if passed else 'FAIL'} "
              f"(largest error / tolerance {worst:.2f}){'' if passed else '; not timed'}", flush=True)
        if not passed:
            failed = True
            continue
        got = measure(shape, a.rounds)
        print(f"[{i + 1}/{len(shapes)}, {time.time() - t0:5.1f} s] {label}: timed", flush=True)
        for side, rounds in got.items():
            fastest = min(r["step"] for r in rounds)
            print(f"  {side} ({rounds[0]['steps']} steps a round; medians, µs):")
            for j, r in enumerate(rounds):
                print(round_line(j, r, r["step"] > SLOW * fastest))
        sys.stdout.flush()
        results.append((label, got))
        torch.cuda.empty_cache()
    print(f"\nsummary: slow rounds (step over {SLOW}x the side's fastest round) against the others, medians "
          f"of round medians [{time.time() - t0:.1f} s]")
    for label, got in results:
        for side, rounds in got.items():
            print("\n".join(summary(label, side, rounds)))
    if failed:
        print("a gradient check failed: that row was not timed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
