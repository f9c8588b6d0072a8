"""Probe (issue 25): where each work tile of stage 7's work queue ran, and when.

Splitting the queue's last partial wave along the keys (experiments/tail_split/tail_split_ab.py,
results/logs/2026-11-26-5580a3e-h100) was predicted to save 2-3% at B4 H16 S8192 D128 (4,096 work
tiles on 132 SMs: 31.03 per SM, so 4 SMs would run a 32nd tile alone) and saved about 0.4%. The
guess then: the queue hands out tiles as SMs free up, SMs do not all run at the same pace, and the
faster ones take the extra tiles, so little of the last wave is idle time. This measures it.

Stage 7's kernel as it is, compiled from its source with a few lines added in this script's
memory only (stages/stage7.cu is not changed, so no record goes stale): consumer 0's first thread
of each block writes, per work tile, the SM it ran on (%smid) and the global timer (ns) when
the tile started and when its output was stored. The same launch as stage7.forward picks, with
one more pointer. From those: work tiles per SM, each SM's mean time per tile, and how much of
the launch's SM time was idle at its end (every SM's last store against the launch's last).

    python experiments/tail_split/queue_tail_probe.py --out queue_tail.json [--shape 4 16 8192 128]

Measured (results/logs/2026-11-26-e81cead-h100): the guess was wrong. Every SM
ran at the same pace within 1% (68.9-69.9 µs per tile at B4 H16 S8192 D128, 20.1-20.5 at B16 H16
S2048 D64), the SMs with one tile more were not faster, and the end of the launch left 2.53% of
the SM time idle at B4 H16 S8192 D128 (128 SMs' last stores at 2,138-2,150 µs, the 4 with a 32nd
tile at 2,207), 3.02% at B16 H16 S2048 D64, 3.05% at B2 H16 S8192 D128 and 2.79% at B3. The
first split's build, which ran 1-2.6% slower everywhere, cost what the split saved; the second
(its combine in a kernel of its own, 2026-11-26-41ed404-h100) ran 1.019x at B4 H16 S8192 D128 and is
stage 7's default there (stage7.TAIL_SPLIT). This probe builds the kernel without the split (tail_split
False): it shows the queue as it hands out whole tiles. Again in 2026-11-26-ca620d9-h100: 2.54% and
2.83% idle. With --split (results/logs/2026-11-26-adb4d44-h100): at B4 H16 S8192 D128 the 40 pieces
(7.6-9.9 µs each) are done by 2,157 µs and the kernel ends on a whole tile at 2,176 µs against 2,239
without (idle at the end 1.12% against 2.60%); at B16 H16 S2048 D64 each SM gets one piece
(6.7-9.7 µs) after its 21 whole tiles, which end between 425 and 434 µs, so the kernel ends at
443 µs against 446: the combine kernel's launch takes that back, and D64 runs without the split.
"""
import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import numpy as np  # noqa: E402
import torch  # noqa: E402

from lib import fp8, nvrtc  # noqa: E402
from lib import results as R  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from stages import stage6, stage7  # noqa: E402

# The lines added to stage7.cu, each after (or replacing) a line that occurs once: the probe's
# pointer, the start of each work item (a work tile, or with --split a piece of one), and its
# end, once its rows are stored (a piece's in fp32, for the combine kernel).
RECORD = ("        if (threadIdx.x == 128 * WARP_SPECIALIZED) {\n"
     "            unsigned long long t1;\n"
     "            unsigned smid;\n"
     "            asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t1));\n"
     "            asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(smid));\n"
     "            probe[3 * w] = smid, probe[3 * w + 1] = probe_t0, probe[3 * w + 2] = t1;\n"
     "        }\n")
PATCH = [
    ("float* __restrict__ lse_part) {",
     "float* __restrict__ lse_part, unsigned long long* probe) {"),
    ("        if (w >= items) break;\n",
     "        if (w >= items) break;\n"
     "        unsigned long long probe_t0;\n"
     "        asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(probe_t0));\n"),
    ("        finish(t, l);\n    }\n",
     "        finish(t, l);\n" + RECORD + "    }\n"),
    ("            finish_piece(t, l, m, scale_tile);\n",
     "            finish_piece(t, l, m, scale_tile);\n" + RECORD.replace("        ", "            ")),
]


def probed_source() -> str:
    src = stage7.SOURCE.read_text()
    for old, new in PATCH:
        if src.count(old) != 1:
            raise SystemExit(f"queue_tail_probe.py: stage7.cu has changed: {old.strip()[:60]!r} is no longer there once")
        src = src.replace(old, new)
    return src


def run(B, H, S, D, causal=False, split=False) -> dict:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
    q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
    vt = fp8.v_for_pv(v8)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ch = stage7.choose(B, H, S, S, D, causal, sms)
    cfg = stage7.config(D, ch["tiles"], ch["schedule"], tail_split=split)  # without: the queue of whole tiles
    defines = dict(cfg["defines"])
    if not (cfg["persistent"] and defines["DYNAMIC_WORK"]):
        raise SystemExit(f"queue_tail_probe.py: B{B} H{H} S{S} D{D} does not run the work queue ({ch['schedule']})")
    compiled = nvrtc.compile_cuda(probed_source(), arch=stage7.ARCH, name="stage7_probe.cu",
                                  defines={**nvrtc.ELEMENT_DEFINES[torch.bfloat16], "HEAD_DIM": D, **defines})
    kernel = nvrtc.load_kernel(compiled, "attention_fp8", max_dynamic_smem=cfg["smem"])
    bn, n_work = ch["tiles"][0], ch["work"]
    grid = min(n_work, sms)
    n_qb = -(-S // cfg["block_m"])
    tail_heads = stage6.tail_heads_for(causal, True, n_work // n_qb, n_qb, sms)
    pieces = stage7.tail_pieces(n_work, -(-S // bn), grid, causal) if split else 1
    tail_first = n_work - n_work % grid if pieces > 1 else n_work
    items = tail_first + (n_work - tail_first) * pieces
    parts = [torch.empty((items - tail_first) * cfg["block_m"] * D + 1, dtype=torch.float32, device="cuda"),
             torch.empty((items - tail_first) * cfg["block_m"] + 1, dtype=torch.float32, device="cuda")]
    _, combine = stage7._kernel(torch.bfloat16, D, cfg["defines"], cfg["smem"])
    maps = (stage7.tensor_map(q8, cfg["block_m"], D), stage7.tensor_map(k8, bn, D),
            stage7.tensor_map(vt, D, stage7.vt_atom(bn)))
    probe = torch.zeros(3 * items, dtype=torch.int64, device="cuda")
    out = torch.empty(q.shape, dtype=torch.bfloat16, device="cuda")
    queue = stage7._queue(q.device).data_ptr()

    def launch():
        nvrtc.launch_prepared(kernel, nvrtc.launch_config((grid, 1, 1), (cfg["threads"], 1, 1), cfg["smem"]),
                              (*maps, out.data_ptr(), qd.data_ptr(), kd.data_ptr(), vd.data_ptr(),
                               np.int32(S), np.int32(S), np.int32(H), np.int32(1),
                               np.float32(D ** -0.5 * math.log2(math.e)), np.int32(int(causal)), np.int32(n_work),
                               np.int32(tail_heads), queue, np.int32(tail_first), np.int32(pieces),
                               parts[0].data_ptr(), parts[1].data_ptr(), probe.data_ptr()))
        if pieces > 1:
            n = (n_work - tail_first) * cfg["block_m"] * (D // 4)
            nvrtc.launch_prepared(combine, nvrtc.launch_config((-(-n // 256), 1, 1), (256, 1, 1), pdl=True),
                                  (parts[0].data_ptr(), parts[1].data_ptr(), out.data_ptr(), np.int32(S), np.int32(S),
                                   np.int32(H), np.int32(1), np.int32(n_work), np.int32(tail_first), np.int32(pieces)))
    for _ in range(3):  # warm: the last of these is the one read
        launch()
    torch.cuda.synchronize()
    same = torch.equal(out, stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=int(causal), scale=D ** -0.5,
                                           tail_split=split))
    p = probe.view(items, 3).cpu().tolist()
    t0 = min(r[1] for r in p)
    tiles = [{"w": w, "sm": r[0], "start_us": (r[1] - t0) / 1e3, "end_us": (r[2] - t0) / 1e3, "piece": w >= tail_first}
             for w, r in enumerate(p)]
    whole_end = sorted(t["end_us"] for t in tiles if not t["piece"])
    piece_us = [t["end_us"] - t["start_us"] for t in tiles if t["piece"]]
    per_sm = {}
    for t in tiles:
        per_sm.setdefault(t["sm"], []).append(t)
    end = max(t["end_us"] for t in tiles)
    last = {sm: max(t["end_us"] for t in ts) for sm, ts in per_sm.items()}
    first = {sm: min(t["start_us"] for t in ts) for sm, ts in per_sm.items()}
    pace = {sm: (last[sm] - first[sm]) / len(ts) for sm, ts in per_sm.items()}  # µs per tile, start to last store
    counts = [len(ts) for ts in per_sm.values()]
    idle = sum(end - x for x in last.values()) / (len(per_sm) * end)
    return {"B": B, "H": H, "S": S, "D": D, "causal": causal, "split": split, "pieces": pieces,
            "work": n_work, "grid": grid, "sms_used": len(per_sm),
            "same_bits_as_stage7": same, "end_us": end,
            "tiles_per_sm": {str(c): counts.count(c) for c in sorted(set(counts))},
            "pace_us_per_tile": {"min": min(pace.values()), "median": statistics.median(pace.values()),
                                 "max": max(pace.values())},
            "pace_by_tiles": {str(c): statistics.median(pace[sm] for sm, ts in per_sm.items() if len(ts) == c)
                              for c in sorted(set(counts))},
            "last_store_us": {"min": min(last.values()), "median": statistics.median(last.values()), "max": end},
            "idle_share_at_end": idle,
            "whole_tiles_last_end_us": whole_end[-1],
            "pieces_us": ({"min": min(piece_us), "median": statistics.median(piece_us), "max": max(piece_us),
                           "first_start": min(t["start_us"] for t in tiles if t["piece"]),
                           "last_end": max(t["end_us"] for t in tiles if t["piece"])} if piece_us else None),
            "tiles": tiles}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write every tile's SM and times, with the env, as JSON")
    ap.add_argument("--shape", nargs=4, type=int, action="append", metavar=("B", "H", "S", "D"),
                    help="full attention at this shape (repeatable; default: issue 25's two standard shapes)")
    ap.add_argument("--split", action="store_true", help="the build with TAIL_SPLIT, its pieces recorded too")
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: runs stage 7 (e4m3 wgmma, sm_90a), so it needs an H100 or H200 and none was found\n")
    rows = []
    for B, H, S, D in a.shape or [(4, 16, 8192, 128), (16, 16, 2048, 64)]:
        r = run(B, H, S, D, split=a.split)
        rows.append(r)
        pace, last = r["pace_us_per_tile"], r["last_store_us"]
        print(f"B{B} H{H} S{S} D{D} full: {r['work']} work tiles on {r['sms_used']} SMs; tiles per SM "
              f"{r['tiles_per_sm']}; µs per tile by SM {pace['min']:.1f} / {pace['median']:.1f} / {pace['max']:.1f} "
              f"(min / median / max), median by tile count {r['pace_by_tiles']}; last store per SM "
              f"{last['min']:.0f} / {last['median']:.0f} / {last['max']:.0f} µs; idle at the end "
              f"{r['idle_share_at_end']:.2%} of the SM time; same bits as stage7.forward: {r['same_bits_as_stage7']}",
              flush=True)
        if r["pieces_us"]:
            pc = r["pieces_us"]
            print(f"  {r['pieces']} pieces per tail tile: each {pc['min']:.1f} / {pc['median']:.1f} / {pc['max']:.1f} µs; "
                  f"pieces from {pc['first_start']:.0f} to {pc['last_end']:.0f} µs; last whole tile stored at "
                  f"{r['whole_tiles_last_end_us']:.0f} µs", flush=True)
    if a.out:
        a.out.write_text(json.dumps({"env": R.capture_env(), "rows": rows}, indent=1))
    return 0 if all(r["same_bits_as_stage7"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
