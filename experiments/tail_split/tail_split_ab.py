"""Experiment (issue 25): stage 7 with and without TAIL_SPLIT, in the same interleaved rounds.

Full attention's work tiles all take the same time, so the work queue's last n_work mod SMs tiles
run alone while the other SMs idle for a whole work tile: at B4 H16 S8192 D128, 4 tiles of 4,096
on 132 SMs (32 tiles' time for 31.03 per SM), at B16 H16 S2048 D64 44 of 2,816 (22 for 21.33).
TAIL_SPLIT (stages/stage7.cu) splits those last tiles along their keys into pieces the queue
hands out as SMs free up; a second kernel combines them. Predicted: 2-3% at those two
shapes; nothing at causal shapes (never split) or where the rule leaves the tail whole.

Measured, first version (2026-11-26, H100, at 5580a3e, results/logs/2026-11-26-5580a3e-h100: the last
piece of each tile to finish combined them, inside the attention kernel; that change, never merged,
is experiments/tail_split/tail_split.patch, onto 9fc6491^): no. Whole over split, same rounds:
0.979 at B4 H16 S8192 D128 full (10 pieces),
0.990 at B16 H16 S2048 D64 full (3), 0.988 at B3 H16 S8192 D128 (3), 1.009 at B8 H16 S4096 D64
(3); and where the split build split nothing, 0.974-0.989 (both causal shapes, B2 H16 S8192
D128). The build with the split ran 1.1-2.6% slower even unsplit: its softmax's loop has the same
instructions, but the score scale sits in a general register instead of a uniform one (the SASS,
compared offline). Against that build, the split itself gained about 0.4% at S8192 D128 and 0.1-2% at
the other shapes, far under the 3% the idle SMs predicted. The idle time is real:
experiments/tail_split/queue_tail_probe.py (2026-11-26-e81cead-h100) found every SM within 1% of the
same pace per tile and 2.5-3.1% of the SM time idle at the launch's end at these shapes. So what
lost was the split build's own cost, not the idea.

Measured, second version (2026-11-26-41ed404-h100, at 41ed404: the pieces combined by a second kernel,
attention_fp8_combine_tail, launched with PDL; the attention kernel's main loop then keeps the
score scale in a uniform register as the build without does): whole over split 1.019 at B4 H16
S8192 D128 full (10 pieces) and at B3 (3), 1.014 causal and 1.000 at B2 H16 S8192 (nothing split);
at D64 0.995 at B16 H16 S2048 full (3), 0.992 causal, 1.010 at B8 H16 S4096 (3). Kept at D128
(stage7.TAIL_SPLIT). With --pieces 6 8 at D64 (2026-11-26-b7a0e66-h100): 0.995-1.000 for 6 and 8 pieces.

Each shape times stage 7's kernel on prepared e4m3 inputs (stage7.forward) as called and with
tail_split=True and False in the same interleaved rounds, each round in the order split, whole, whole,
split: the board runs at its power limit, and a callable's place in the round moved timings by
7-9% at D128 when stage 6 (bf16) shared the rounds (results/logs/2026-11-26-9fc6491-h100, whose
first version of this script timed the pair in both orders beside stage 6). Each variant's time is
the geometric mean of its two places' medians. Stage 6 is timed in rounds of its own, after. Both
variants are checked against lib.fp8's emulation before and after timing. Logs only (--out): nothing is
recorded.

    python experiments/tail_split/tail_split_ab.py --out tail_split.json
    python experiments/tail_split/tail_split_ab.py --head-dims 64 --pieces 6 8 --out pieces.json  # other piece counts too
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

from lib import fp8  # noqa: E402
from lib import results as R  # noqa: E402
from lib.inputs import causal_mode, make_qkv  # noqa: E402
from lib.reference import attention_flops  # noqa: E402
from lib.timing import time_interleaved  # noqa: E402
from stages import stage6, stage7  # noqa: E402

# (B, H, S, D, causal): issue 25's shapes, more full ones with a partial last wave (B3 H16 S8192:
# 36 tiles left over, 3 pieces; B8 H16 S4096 D64: 44), and one the rule leaves whole (B2 H16
# S8192 D128: 68 left over, more than half a wave).
SHAPES = [(16, 16, 2048, 64, False), (16, 16, 2048, 64, True), (4, 16, 8192, 128, False), (4, 16, 8192, 128, True),
          (3, 16, 8192, 128, False), (8, 16, 4096, 64, False), (2, 16, 8192, 128, False)]


def forced_pieces(n: int, call):
    """`call` with every tail tile split into n pieces: stage7.forward looks tail_pieces up at
    each call, so it is swapped for the call's length."""
    def run():
        rule = stage7.tail_pieces
        stage7.tail_pieces = lambda *args: n
        try:
            return call()
        finally:
            stage7.tail_pieces = rule
    return run


def check(out, q, k, v, causal, sms) -> dict:
    B, H, S, D = q.shape
    build = stage7.emulation_of(B, H, S, S, D, causal, sms)
    c = fp8.check_on_emulation(out, *fp8.prepare(q, k, v), causal=causal, **build)
    return {k: c[k] for k in ("passed", "worst", "rmse_ratio")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write every timing, with the env, as JSON")
    ap.add_argument("--budget-s", type=float, default=0.4, help="seconds of timing per callable (default 0.4)")
    ap.add_argument("--head-dims", nargs="+", type=int, choices=(64, 128), default=[64, 128], help="only these shapes")
    ap.add_argument("--pieces", nargs="+", type=int, default=[],
                    help="also split each tail tile into this many pieces, whatever stage7.tail_pieces says (full "
                         "attention only; at most the key tiles)")
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: runs stage 7 (e4m3 wgmma, sm_90a), so it needs an H100 or H200 and none was found\n")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, ok = [], True
    for B, H, S, D, causal in SHAPES:
        if D not in a.head_dims or (a.pieces and causal):
            continue
        q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
        q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
        vt = fp8.v_for_pv(v8)
        code = causal_mode(causal, S, S, stage7.INFO)
        run = {"split": lambda: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code, scale=D ** -0.5,
                                               tail_split=True),
               "whole": lambda: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code, scale=D ** -0.5,
                                               tail_split=False)}
        ch = stage7.choose(B, H, S, S, D, causal, sms)
        pieces = stage7.tail_pieces(ch["work"], -(-S // ch["tiles"][0]), min(ch["work"], sms), causal)
        for n in a.pieces:
            run[f"split in {n}"] = forced_pieces(n, lambda: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code,
                                                                            scale=D ** -0.5, tail_split=True))
        checks = {name: [check(fn(), q, k, v, causal, sms)] for name, fn in run.items()}
        names = list(run)  # each variant twice in a round, in mirrored order: A, B, …, …, B, A
        t = time_interleaved({f"{n} {i}": run[n] for i, order in ((1, names), (2, names[::-1])) for n in order},
                             budget_s=a.budget_s)
        us = {n: (t[f"{n} 1"].median_us * t[f"{n} 2"].median_us) ** 0.5 for n in run}
        us["stage 6"] = time_interleaved({"stage 6": lambda: stage6.attention(q, k, v, causal=causal)},
                                         budget_s=a.budget_s)["stage 6"].median_us
        for name, fn in run.items():
            checks[name].append(check(fn(), q, k, v, causal, sms))
        passed = all(c["passed"] for cs in checks.values() for c in cs)
        ok &= passed
        flops = attention_flops(B, H, S, S, D, causal)
        row = {"B": B, "H": H, "S": S, "D": D, "causal": causal, "work": ch["work"], "pieces": pieces, "us": us,
               "places_us": {n: x.median_us for n, x in t.items()},
               "round_medians_us": {n: x.round_medians_us for n, x in t.items()}, "checks": checks, "passed": passed,
               "whole_over_split": us["whole"] / us["split"], "tflops_split": flops / us["split"] / 1e6,
               "tflops_whole": flops / us["whole"] / 1e6, "split_vs_stage6": us["stage 6"] / us["split"],
               "whole_over": {n: us["whole"] / us[n] for n in run}}
        rows.append(row)
        places = ", ".join(f"{n} {x.median_us:,.1f}" for n, x in t.items())
        print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} ({ch['work']} work tiles, {pieces} pieces): "
              f"whole/split {row['whole_over_split']:.3f}; split {row['tflops_split']:.0f} TFLOPS, whole "
              f"{row['tflops_whole']:.0f}; split {row['split_vs_stage6']:.3f}x stage 6 (rounds of its own); "
              + "".join(f"whole/{n} {x:.3f}; " for n, x in row["whole_over"].items() if n.startswith("split in"))
              + f"µs by place: {places}; {'pass' if passed else 'FAIL'}", flush=True)
    if a.out:
        a.out.write_text(json.dumps({"env": R.capture_env(), "budget_s": a.budget_s, "rows": rows}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
