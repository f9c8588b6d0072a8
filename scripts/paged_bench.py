"""Stage 6's paged KV cache against the same cache contiguous (issue 50), on the GPU, same-run ratios.

Each row: a decoding (or speculative-decoding) call against caches of Sk keys per entry, the keys
once in pages (shuffled, page_table) and once contiguous ([B, H_kv, Sk, D] with seqlens_k), timed
in the same interleaved rounds (lib.timing.time_interleaved); each paged call is checked against
the float64 reference of the gathered keys first, on the same inputs. The target: paged at least
0.95x contiguous (contiguous_us / us >= 0.95) at every row, page size 16 included.

    python scripts/paged_bench.py             # print
    python scripts/paged_bench.py --record    # and store under "paged" in results/<gpu>.json
    python scripts/paged_bench.py --quick     # a few rows
"""
import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import torch  # noqa: E402

import stages.stage6 as s6  # noqa: E402
from lib import results as R  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_output  # noqa: E402
from lib.timing import time_interleaved  # noqa: E402
from test_stage6_paged import paged_cache  # noqa: E402

DTYPE = torch.bfloat16
D, H, HKV = 128, 32, 8
PAGE_SIZES = (16, 64, 256)
# (B, Sq, Sk): decoding over batch and cache length, and a few speculative (bottom-right) rows
ROWS = [(B, 1, Sk) for B in (1, 8, 64) for Sk in (1024, 4096, 16384, 32768) if B * Sk <= 64 * 16384] \
    + [(1, 4, 8192), (8, 4, 4096), (1, 16, 8192), (8, 16, 4096)]
QUICK = [(1, 1, 4096), (8, 1, 16384), (64, 1, 1024), (8, 4, 4096)]


def checked(out, q, k, v, lens, causal) -> bool:
    """The paged call's output against the reference of each entry's keys (a sample of entries)."""
    for b in sorted({0, len(lens) - 1, len(lens) // 2}):
        n = lens[b]
        c = check_output(out[b:b + 1], q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal=causal)
        if not c.passed:
            print(f"  entry {b} ({n} keys): {c.summary()}", flush=True)
            return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    rows, ok, t0 = [], True, time.time()
    g = random.Random(50)
    for B, Sq, Sk in (QUICK if a.quick else ROWS):
        causal = "bottom_right" if Sq > 1 else False
        q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=HKV, dtype=DTYPE, seed=B + Sq + Sk)
        lens = [Sk] * B  # every entry full: the same work paged and contiguous
        seqlens = torch.tensor(lens, dtype=torch.int32, device=q.device)
        fns, passed, caches = {}, {}, {}
        for ps in PAGE_SIZES:
            kc, vc, table = paged_cache(k, v, lens, ps, spare=0, shared=False, generator=g)
            caches[ps] = (kc, vc, table)
            out = s6.attention(q, kc, vc, causal=causal, seqlens_k=seqlens, page_table=table)
            passed[ps] = checked(out, q, k, v, lens, causal)
            fns[f"paged {ps}"] = (lambda kc=kc, vc=vc, table=table:
                                  s6.attention(q, kc, vc, causal=causal, seqlens_k=seqlens, page_table=table))
        fns["contiguous"] = lambda: s6.attention(q, k, v, causal=causal, seqlens_k=seqlens)
        times = time_interleaved(fns, rounds=a.rounds, budget_s=0.3)
        base = times["contiguous"]
        print(f"B{B} H{H}/{HKV} Sq{Sq} Sk{Sk} D{D} bf16: contiguous {base.median_us:,.1f} µs "
              f"({time.time() - t0:.0f} s)", flush=True)
        for ps in PAGE_SIZES:
            t = times[f"paged {ps}"]
            ratio = base.median_us / t.median_us
            rows.append({"B": B, "H": H, "Hkv": HKV, "Sq": Sq, "Sk": Sk, "D": D, "dtype": "bfloat16",
                         "causal": bool(causal), "page_size": ps, "us": t.median_us,
                         "us_rounds": t.round_medians_us, "contiguous_us": base.median_us,
                         "contiguous_us_rounds": base.round_medians_us, "ratio": ratio,
                         "passed": passed[ps]})
            ok &= passed[ps]
            print(f"  page {ps:3d}: {t.median_us:10,.1f} µs  {ratio:5.3f}x contiguous "
                  f"{'(target >= 0.95) ' if ratio < 0.95 else ''}{'pass' if passed[ps] else 'FAIL'}", flush=True)
        del q, k, v, caches, fns
    worst = min(rows, key=lambda r: r["ratio"])
    print(f"worst: {worst['ratio']:.3f}x at B{worst['B']} Sq{worst['Sq']} Sk{worst['Sk']} page {worst['page_size']}")
    if a.record:
        env = R.capture_env()
        path = R.save_extra(env["gpu"], "paged", {"env": env, "sha256": R.stage_sha256(s6.INFO), "rows": rows})
        print(f"recorded in {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
