"""Where does a training step's GPU time go, kernel by kernel, in stage 6 + 8's step and in SDPA
default's, at the training map's rows below 1x? Each step (forward through autograd, then
.backward(dO), as scripts/backward_bench.py --train-step times it) runs `CALLS` times under
torch.profiler (CUPTI's kernel records); each kernel's summed device time over the calls is
printed per call, next to the step's time with the GPU held and not held (interleaved rounds, the
L2 flushed before each run, as the map).

    python3 experiments/train_step_parts/probe.py [--row B,H,Hkv,S,D,causal ...]
"""
import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib.inputs import make_qkv  # noqa: E402
from lib.timing import flush_l2, sdpa_call, time_interleaved  # noqa: E402
from scripts.backward_bench import leaves, train_step_call  # noqa: E402
from stages import autograd  # noqa: E402

CALLS = 20
# (B, H, Hkv, S, D, causal): the map's rows below 1x in the record at 28e18d9, and one long row beside them
SHORT = [(32, 32, 32, 512, 128, True), (32, 32, 32, 512, 128, False), (16, 32, 32, 1024, 128, True),
         (32, 16, 16, 512, 64, False), (16, 16, 16, 1024, 64, False), (4, 32, 32, 4096, 128, True)]


def kernel_times(fn) -> dict:
    """{kernel name: µs of device time per call} over CALLS calls of fn, the L2 flushed before each
    (the flush's kernels counted too: main() subtracts an empty step's)."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            flush_l2()
            fn()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name] += e.device_time / CALLS
    return dict(per)


def short(name: str) -> str:
    return name if len(name) < 90 else name[:60] + "…" + name[-25:]


def row(text: str) -> tuple:
    """--row B,H,Hkv,S,D,causal (causal 0 or 1)."""
    r = [int(x) for x in text.split(",")]
    if len(r) != 6:
        raise argparse.ArgumentTypeError("a row is six integers: B,H,Hkv,S,D,causal")
    return (*r[:5], bool(r[5]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--row", type=row, action="append", help="B,H,Hkv,S,D,causal (repeatable; default SHORT)")
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: times stage 6 + 8's training step (sm_90a), so it needs an H100 or H200 and none was found\n")
    rows = a.row or SHORT
    flush = kernel_times(lambda: None)  # the flush's own kernels, subtracted below
    print("the L2 flush: " + ", ".join(f"{short(n)} {t:.1f} µs" for n, t in flush.items()))
    for B, H, Hkv, S, D, causal in rows:
        q, k, v = make_qkv(B, H, S, D, Hkv=Hkv, dtype=torch.bfloat16)
        dout = torch.randn_like(q)
        ours, theirs = leaves(q, k, v), leaves(q, k, v)
        steps = {"stage 6 + 8": train_step_call(lambda: autograd.attention(*ours, forward=6, causal=causal), ours, dout),
                 "SDPA default": train_step_call(sdpa_call(*theirs, causal=causal), theirs, dout)}
        held = time_interleaved(steps, rounds=5, budget_s=0.5)
        free = time_interleaved(steps, rounds=5, budget_s=0.5, hold=False)
        print(f"\nB{B} H{H}/{Hkv} S{S} D{D} {'causal' if causal else 'full'}: step held "
              + ", ".join(f"{n} {t.median_us:,.1f} µs" for n, t in held.items())
              + f" ({held['SDPA default'].median_us / held['stage 6 + 8'].median_us:.3f}x); not held "
              + ", ".join(f"{n} {t.median_us:,.1f} µs" for n, t in free.items())
              + f" ({free['SDPA default'].median_us / free['stage 6 + 8'].median_us:.3f}x)", flush=True)
        for name, fn in steps.items():
            per = kernel_times(fn)
            per = {n: t - flush.get(n, 0.0) for n, t in per.items() if t - flush.get(n, 0.0) > 0.05}
            print(f"  {name}: kernels {sum(per.values()):,.1f} µs a step")
            for n, t in sorted(per.items(), key=lambda x: -x[1]):
                print(f"    {t:9.1f} µs  {short(n)}")
        del q, k, v, dout, ours, theirs, steps
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
