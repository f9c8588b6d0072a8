"""The end of stage 8's dK/dV blocks, and the postprocess. At the training map's S 512 rows a key
block walks only 8 query steps (4 to 8 causal), and the dK/dV kernel ran 1.07-1.19x cuDNN's time
there while level at S 8192 (experiments/train_step_parts): what a block costs besides its steps
counts. EPILOGUE_SMEM (dK and dV stored through shared memory as 16-byte pieces of rows, instead
of the accumulators' 4-byte pairs: 16 bytes of 8 lines a warp store) against the build without it,
in interleaved rounds on the same tensors beside SDPA's default backward, gradients checked against
float64 before and after timing, dK and dV compared bit for bit (scripts/backward_bench.py's
ab_rows), from S 512 to S 8192. (The first form, h200_f6d59ce.log, also timed EXIT_ON_READ, the
producer's last wait for its bulk reductions' reads instead of their landing: level, 0.993-1.007x;
not kept.) Then the postprocess (dQ's float32 tiles to rows in q's dtype), the kernel before (4 bytes a store,
postprocess_before.cu here) against the stage's (two 16-byte pieces a thread), alone, the L2 flushed
before each run, outputs compared bit for bit.

    python3 experiments/backward_epilogue/probe.py [--rounds 7] [--only post]
"""
import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from backward_bench import ab_rows  # noqa: E402
from lib import nvrtc  # noqa: E402
from lib.timing import time_interleaved  # noqa: E402
from stages import stage8  # noqa: E402

# (B, H, S, D, causal): the training map's short MHA rows below 1x, then the backward record's
ROWS = [(32, 32, 512, 128, True), (32, 32, 512, 128, False), (32, 16, 512, 64, False), (16, 16, 1024, 64, False),
        (16, 32, 1024, 128, True), (16, 16, 2048, 64, False), (16, 16, 2048, 64, True), (8, 32, 2048, 128, False),
        (8, 16, 4096, 128, False), (4, 16, 8192, 64, False), (4, 16, 8192, 128, False), (4, 16, 8192, 128, True)]
BUILDS = {"build": {}, "epilogue_smem": {"epilogue_smem": 1}}
POST_SHAPES = [(32, 32, 512, 128), (32, 16, 512, 64), (4, 16, 8192, 128)]  # (B, H, Sq, D) of dQ


def postprocess_ab(rounds: int) -> bool:
    ok = True
    for B, H, Sq, D in POST_SHAPES:
        acc = torch.randn(B, H, Sq, D, device="cuda")  # Sq a multiple of 64: sq_pad = Sq
        before = nvrtc.stage_kernels(Path(__file__).with_name("postprocess_before.cu"),
                                     ("attention_backward_postprocess",), torch.bfloat16, D)["attention_backward_postprocess"]
        quads = B * H * Sq * D // 4
        out_before = torch.empty(B, H, Sq, D, dtype=torch.bfloat16, device="cuda")
        cfg = nvrtc.launch_config((-(-quads // 256), 1, 1), (256, 1, 1))
        args = (acc.data_ptr(), out_before.data_ptr(), np.int32(Sq), np.int32(Sq // 64), np.int64(quads), np.float32(0.125))
        fns = {"before": lambda: nvrtc.launch_prepared(before, cfg, args),
               "stage": lambda: stage8.postprocess(acc, Sq, torch.bfloat16, scale=0.125)}
        fns["before"]()
        same = torch.equal(out_before, fns["stage"]())
        ok &= same
        t = time_interleaved(fns, rounds=rounds, budget_s=0.5)
        gb = B * H * Sq * D * 6 / 1e9  # float32 read, 16-bit written
        print(f"postprocess B{B} H{H} S{Sq} D{D}: before {t['before'].median_us:7.1f} µs ({gb / t['before'].median_us * 1e3:5.2f} TB/s), "
              f"stage {t['stage'].median_us:7.1f} µs ({gb / t['stage'].median_us * 1e3:5.2f} TB/s), "
              f"before/stage {t['before'].median_us / t['stage'].median_us:.3f}; outputs {'bit-equal' if same else 'DIFFER'}",
              flush=True)
        del acc, out_before
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", choices=("post", "blocks"))
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: times stage 8's Hopper build (sm_90a), so it needs an H100 or H200 and none was found\n")
    ok = True
    if a.only != "blocks":
        ok &= postprocess_ab(a.rounds)
    if a.only != "post":
        ok &= ab_rows(ROWS, lambda D: BUILDS, a.rounds)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
