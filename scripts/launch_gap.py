"""How much of an event-timed call was the host's launch, not the GPU's work.

lib.timing flushes L2 before each timed run. Until this script was written it then recorded the
start event and launched the call at once (the record at 8b8fa98 was timed so): when launching costs the host more than the GPU
spends on the flush (about 30 µs for 100 MB), the GPU sits idle between the start event and the
kernel, and that wait is timed as the kernel's. Now the GPU spins before each start event until
the host has queued the call (hold=True). This script times the same calls both ways, in turns,
next to the host time per call and the GPU time of unflushed back-to-back calls (time_host), so
the size of the error in rows recorded the old way can be read off:

    python scripts/launch_gap.py                     # print the table
    python scripts/launch_gap.py --json gap.json     # and write the rows
    python scripts/launch_gap.py --record            # and store them under "launch_gap" in
                                                     # results/<gpu>.json (its tables mark the
                                                     # shapes where SDPA's recorded time is off)
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch  # noqa: E402

import stages  # noqa: E402
from lib import results as R  # noqa: E402
from lib.bench import STANDARD_SHAPES  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.simulator import HAS_GPU  # noqa: E402
from lib.timing import sdpa_call, time_cuda, time_host  # noqa: E402


def callables(q, k, v, causal, stage_numbers):
    out = {"SDPA default": sdpa_call(q, k, v, causal=causal),
           "SDPA flash": sdpa_call(q, k, v, causal=causal, backend="flash")}
    cc = torch.cuda.get_device_capability()
    for n in stage_numbers:
        mod = stages.get(n)
        if cc >= tuple(mod.INFO.min_cc):
            out[f"stage {n}"] = (lambda m: lambda: m.attention(q, k, v, causal=causal))(mod)
    return {name: fn for name, fn in out.items() if fn is not None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["latency", "throughput"],
                    choices=[s[0] for s in STANDARD_SHAPES])
    ap.add_argument("--stages", nargs="+", type=int, default=[3, 5, 6], choices=stages.NUMBERS)
    ap.add_argument("--turns", type=int, default=3, help="old and held timings taken in turns")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--record", action="store_true",
                    help="store the rows under 'launch_gap' in results/<gpu>.json")
    a = ap.parse_args()
    if not HAS_GPU:
        ap.exit(2, f"{ap.prog}: times kernels, so it needs a CUDA GPU; none was found\n")
    rows = []
    print("| shape | causal | call | old µs (launch gap timed) | held µs | old / held | "
          "host µs/call | GPU µs/call, unflushed |\n|---|---|---|---|---|---|---|---|", flush=True)
    for name, B, H, S, D in STANDARD_SHAPES:
        if name not in a.shapes:
            continue
        q, k, v = make_qkv(B, H, S, D, dtype=torch.float16)
        for causal in (False, True):
            for call, fn in callables(q, k, v, causal, a.stages).items():
                old, held = [], []
                for _ in range(a.turns):
                    old.append(time_cuda(fn, hold=False, budget_s=0.3).median_us)
                    held.append(time_cuda(fn, hold=True, budget_s=0.3).median_us)
                h = time_host(fn, calls=100)
                row = {"shape": name, "B": B, "H": H, "S": S, "D": D, "causal": causal,
                       "call": call, "old_us": statistics.median(old),
                       "held_us": statistics.median(held), "old_turns_us": old,
                       "held_turns_us": held, "host_us": h.host_us, "gpu_unflushed_us": h.gpu_us}
                rows.append(row)
                print(f"| {name} B{B} H{H} S{S} D{D} | {'yes' if causal else 'no'} | {call} | "
                      f"{row['old_us']:,.1f} | {row['held_us']:,.1f} | "
                      f"{row['old_us'] / row['held_us']:.3f} | {h.host_us:,.1f} | "
                      f"{h.gpu_us:,.1f} |", flush=True)
    env = R.capture_env()
    if a.json:
        Path(a.json).write_text(json.dumps({"env": env, "rows": rows}, indent=1) + "\n")
    if a.record:
        path = R.save_extra(env["gpu"], "launch_gap", {"env": env, "rows": rows})
        print(f"recorded under 'launch_gap' in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
