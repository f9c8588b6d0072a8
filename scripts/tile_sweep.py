"""Measure every tile choice of the stages that offer them (stage 4: BLOCK_Q × BLOCK_K; stage
5: also STAGES, and its swizzle off), at the standard shapes of each head dim, fp16, full and
causal. Each choice is checked for correctness on an odd shape before it is timed.

    python scripts/tile_sweep.py                # print the table
    python scripts/tile_sweep.py --record       # and store it under "tiles" in results/<gpu>.json
    python scripts/tile_sweep.py --stages 5 --head-dims 128 --interleaved --out ab.json

The stage modules' TILES (the choice per head dim) should be the fastest rows here. The record
times each variant in one go, one after another, so a difference of a few percent between two
rows may be the GPU's pace changing between them. --interleaved times every variant of a shape
and mask in the same rounds instead (lib.timing.time_interleaved: round 1 of each, then round
2, ...), which can settle such a difference; its rows go to --out only, not to the record.
"""
import argparse
import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch  # noqa: E402

import stages  # noqa: E402
from lib import nvrtc  # noqa: E402
from lib import results as R  # noqa: E402
from lib.bench import STANDARD_SHAPES  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import attention_flops, check_attention  # noqa: E402
from lib.simulator import HAS_GPU  # noqa: E402
from lib.timing import time_cuda, time_interleaved  # noqa: E402

SHAPE_OF_D = {64: "throughput", 128: "long"}  # the standard shape each head dim is tuned at


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after each option; the description kept as written."""


def variants(mod):
    """(label, keyword arguments) of every alternative a stage offers."""
    out = [(str(t), {"tiles": t}) for t in mod.CHOICES]
    if "swizzle" in mod.attention.__code__.co_varnames:
        for D, t in mod.TILES.items():
            out.append((f"{t} no swizzle (D{D})", {"tiles": t, "swizzle": False, "only_D": D}))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--stages", type=int, nargs="+", default=[4, 5], choices=stages.NUMBERS,
                    metavar="N", help="stages with tile choices (a CHOICES list)")
    ap.add_argument("--record", action="store_true",
                    help="store the rows under 'tiles' in results/<gpu>.json (not when a check "
                         "fails)")
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128], choices=[64, 128],
                    help="the head dims to sweep (each at its standard shape)")
    ap.add_argument("--interleaved", action="store_true",
                    help="time a shape's variants in the same interleaved rounds (not recorded)")
    ap.add_argument("--out", type=Path, help="also write the rows (and the environment) as JSON")
    a = ap.parse_args()
    if a.interleaved and a.record:
        ap.error("--interleaved rows are not the record's kind: write them with --out")
    no_choices = [n for n in a.stages if not hasattr(stages.get(n), "CHOICES")]
    if no_choices:
        ap.error(f"stage(s) {no_choices} offer no tile choices (no CHOICES)")
    if not HAS_GPU:
        ap.exit(2, f"{ap.prog}: times kernels, so it needs a CUDA GPU and none was found; "
                   "nothing measured or recorded\n")
    rows, ok = [], True
    for n in a.stages:
        mod = stages.get(n)
        for name, B, H, S, D in STANDARD_SHAPES:
            if name != SHAPE_OF_D.get(D) or D not in a.head_dims:
                continue
            built = []  # (label, fn, row fields, whether the variant's checks passed)
            for label, kw in variants(mod):
                kw = dict(kw)
                if kw.pop("only_D", D) != D:
                    continue
                fn = functools.partial(mod.attention, **kw)
                compiled = next(iter(mod.compile_for(nvrtc.gpu_arch(), torch.float16, D,
                                                     **kw).values()))
                ptxas = next(iter(nvrtc.parse_ptxas_log(compiled.log).values()))
                checks = [check_attention(fn, 1, 2, 67, 45, D, dtype=torch.float16, causal=c)
                          for c in (False, True)]
                fields = {"stage": n, "variant": label, "default": kw.get("swizzle", True)
                          and tuple(kw["tiles"]) == tuple(mod.TILES[D]),
                          "B": B, "H": H, "S": S, "D": D,
                          "registers": ptxas["registers"], "spill_bytes": ptxas["spill_stores"],
                          "threads": mod.config(D, kw["tiles"])["threads"],
                          "smem_bytes": mod.config(D, kw["tiles"])["smem"]}
                built.append((label, fn, fields, all(c.passed for c in checks)))
            q, k, v = make_qkv(B, H, S, D, dtype=torch.float16)
            for causal in (False, True):
                t0 = time.time()
                if a.interleaved:
                    times = time_interleaved({label: functools.partial(fn, q, k, v, causal=causal)
                                              for label, fn, _, _ in built})
                else:
                    times = {label: time_cuda(lambda: fn(q, k, v, causal=causal)) for label, fn, _, _ in built}
                for label, fn, fields, passed in built:
                    t = times[label]
                    row = {**fields, "causal": causal, "us": t.median_us,
                           "tflops": attention_flops(B, H, S, S, D, causal) / t.median_us / 1e6, "passed": passed}
                    if a.interleaved:
                        row["round_medians_us"] = t.round_medians_us
                    ok &= passed
                    rows.append(row)
                    print(f"stage {n} {label:28s} B{B} H{H} S{S} D{D} "
                          f"{'causal' if causal else 'full  '}: {t.median_us:10,.1f} µs "
                          f"{row['tflops']:6.1f} TFLOPS {row['registers']} regs, {row['spill_bytes']} B spilled "
                          f"{'pass' if passed else 'FAIL'}{' (chosen)' if row['default'] else ''}", flush=True)
                print(f"  ({time.time() - t0:.1f} s{', interleaved rounds' if a.interleaved else ''})", flush=True)
            del q, k, v
    if a.out:
        a.out.write_text(json.dumps({"env": R.capture_env(), "interleaved": a.interleaved, "rows": rows}, indent=1) + "\n")
    if a.record and not ok:
        print("not recorded: a tile choice failed its correctness check", file=sys.stderr)
    elif a.record:
        env = R.capture_env()
        shas = {str(n): R.stage_sha256(stages.get(n).INFO) for n in a.stages}
        path = R.save_extra(env["gpu"], "tiles", {"env": env, "sha256": shas, "rows": rows})
        print(f"recorded in {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
