"""Stage 6's two builds of one kernel, timed against each other on the same inputs: the
[B, H, S, D] build (SEQS=0: lengths are kernel arguments) and the build that reads per-sequence
offsets and key lengths (SEQS=1, what attention_varlen and seqlens_k run; here seqlens_k gives
every entry all its keys, so both compute the same attention). Interleaved rounds, L2 flushed,
with SDPA's default backend in the same rounds. Prints one line per shape.

    python experiments/seqs_build/seqs_ab.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import stages.stage6 as s6  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_output  # noqa: E402
from lib.timing import sdpa_call, time_interleaved  # noqa: E402

SHAPES = [(1, 8, 512, 64), (16, 16, 2048, 64), (4, 16, 8192, 128), (32, 16, 512, 64), (8, 16, 1024, 128)]


def main() -> int:
    for B, H, S, D in SHAPES:
        for causal in (False, True):
            q, k, v = make_qkv(B, H, S, D, dtype=torch.float16, device="cuda")
            full = torch.full((B,), S, dtype=torch.int32, device="cuda")
            for kw in ({}, {"seqlens_k": full}):
                c = check_output(s6.attention(q, k, v, causal=causal, **kw), q, k, v, causal=causal)
                assert c.passed, c.summary()
            t = time_interleaved({"dense": lambda: s6.attention(q, k, v, causal=causal),
                                  "seqs": lambda: s6.attention(q, k, v, causal=causal, seqlens_k=full),
                                  "sdpa": lambda: sdpa_call(q, k, v, causal=causal)}, rounds=7)
            d, s, p = (t[n].median_us for n in ("dense", "seqs", "sdpa"))
            print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}: SEQS=0 {d:.1f} us, "
                  f"SEQS=1 {s:.1f} us (SEQS=1 / SEQS=0 {s / d:.3f}); SDPA {p:.1f} us "
                  f"(x{p / d:.3f} SEQS=0, x{p / s:.3f} SEQS=1)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
