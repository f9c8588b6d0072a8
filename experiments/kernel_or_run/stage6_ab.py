"""Stage 6's kernel against the same kernel at an older commit, in the same interleaved rounds
(with SDPA's default backend beside both), on the GPU. The question it answers: did a change to
stages/stage6.cu make stage 6 slower, or did the GPU's pace move between two records? (Session
31's records put stage 6 0–4% lower against SDPA than edf711c's, with small changes to the
kernel in between: issue 21's closing note.)

The older stages/stage6.cu is taken from git (`git show REV:stages/stage6.cu`), or from a file
(--older-file, with --against naming its commit: the GPU machine gets a working tree without
.git), and compiled with
today's defines for each shape's launch (a define it does not know is ignored; a build it cannot
make is reported); today's launcher runs both, its argument list cut to the older kernel's
parameter count (parameters added since come last). Both outputs are checked against the float64
reference first.

    python experiments/kernel_or_run/stage6_ab.py                    # against edf711c
    python experiments/kernel_or_run/stage6_ab.py --against 9e84965 --rounds 7
    python experiments/kernel_or_run/stage6_ab.py --against d1832bb --older-file stage6-d1832bb.cu
    python experiments/kernel_or_run/stage6_ab.py --against 4bb5e7c --older-file stage6-4bb5e7c.cu --decode
"""
import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

import stages.stage6 as s6  # noqa: E402
from lib.inputs import make_qkv, new_output  # noqa: E402
from lib.reference import check_output  # noqa: E402
from lib.timing import sdpa_call, time_interleaved  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# (B, H, H_kv, Sq, Sk, D, causal): the standard shapes, the short prefill rows the map finds
# weakest, and two decoding rows (one query against a cache: split-KV and packed GQA)
SHAPES = [(1, 8, 8, 512, 512, 64, False), (16, 16, 16, 2048, 2048, 64, False), (16, 16, 16, 2048, 2048, 64, True),
          (4, 16, 16, 8192, 8192, 128, False), (4, 16, 16, 8192, 8192, 128, True), (32, 16, 16, 512, 512, 64, False),
          (32, 16, 16, 512, 512, 64, True), (16, 16, 16, 1024, 1024, 64, True), (32, 32, 32, 512, 512, 128, False),
          (32, 32, 32, 512, 512, 128, True), (8, 8, 1, 1, 1024, 64, False), (1, 32, 8, 1, 4096, 128, False)]
# --decode: the shape map's Sq 1 rows whose keys are split (B1 and B8; at Sk 1024 and 4096 every
# one of them combines in its last block, the path session 36 changed)
DECODE_SHAPES = [(B, H, Hk, 1, Sk, D, False) for D in (64, 128) for B in (1, 8) for H, Hk in ((32, 8), (8, 1))
                 for Sk in (1024, 4096)]


def older_source(rev: str, older_file: Path | None = None) -> tuple[Path, int]:
    """stages/stage6.cu at `rev` (or the file holding it) in a temporary file (compile_stage adds
    stages/ to the include path, so its #include "hopper.cuh" resolves to today's), and its
    kernel's parameter count."""
    text = (older_file.read_text() if older_file is not None else
            subprocess.check_output(["git", "-C", str(ROOT), "show", f"{rev}:stages/stage6.cu"], text=True))
    path = Path(tempfile.mkdtemp()) / "stage6.cu"
    path.write_text(text)
    signature = text.split("attention_wgmma(", 1)[1].split(")", 1)[0]
    return path, signature.count(",") + 1


def with_params(n: int, fn):
    """fn run with every kernel launch's arguments cut to the first n."""
    def run():
        launch = s6.nvrtc.launch_prepared
        s6.nvrtc.launch_prepared = lambda kernel, config, params: launch(kernel, config, params[:n])
        try:
            return fn()
        finally:
            s6.nvrtc.launch_prepared = launch
    return run


def plan_with_source(source: Path, q, k, v, causal):
    """A stage 6 plan for this call whose kernel is compiled from `source`."""
    saved_source, saved_kernels = s6.SOURCE, dict(s6._kernels)
    try:
        s6.SOURCE, s6._kernels = source, {}
        return s6._make_plan(q, k, v, causal, None, None, None, False, None, None, None, None)
    finally:
        s6.SOURCE, s6._kernels = saved_source, saved_kernels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="edf711c", help="the older commit of stages/stage6.cu")
    ap.add_argument("--older-file", type=Path, help="the older stages/stage6.cu itself (commit: --against)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
    ap.add_argument("--decode", action="store_true", help="the split decoding rows (DECODE_SHAPES) instead")
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: stage 6 runs on sm_90 GPUs (H100/H200) only\n")
    old, n_old = older_source(a.against, a.older_file)
    dtype = getattr(torch, a.dtype)
    print(f"| shape | causal | today µs | {a.against} µs | today / {a.against} | today vs SDPA | {a.against} vs SDPA |")
    print("|---|---|---|---|---|---|---|")
    ok = True
    ratios = []
    for B, H, Hk, Sq, Sk, D, causal in (DECODE_SHAPES if a.decode else SHAPES):
        q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=dtype)
        plans = {"today": plan_with_source(s6.SOURCE, q, k, v, causal),
                 a.against: plan_with_source(old, q, k, v, causal)}
        run = {name: (lambda p=p: s6._launch(p, q, k, v, None, new_output(q), (0, 0, 0), None))
               for name, p in plans.items()}
        run[a.against] = with_params(n_old, run[a.against])
        for name, fn in run.items():
            c = check_output(fn(), q, k, v, causal=causal)
            ok &= c.passed
            if not c.passed:
                print(f"{name} B{B} H{H}/{Hk} Sq{Sq} Sk{Sk} D{D} causal={causal}: {c.summary()}")
        t = time_interleaved({**run, "sdpa": sdpa_call(q, k, v, causal=causal)}, rounds=a.rounds, budget_s=1.0)
        us = {n: t[n].median_us for n in t}
        ratios.append(us[a.against] / us["today"])
        print(f"| B{B} H{H}/{Hk} Sq{Sq} Sk{Sk} D{D} | {'yes' if causal else 'no'} | {us['today']:,.1f} | {us[a.against]:,.1f} | "
              f"{us[a.against] / us['today']:.3f} | {us['sdpa'] / us['today']:.3f} | {us['sdpa'] / us[a.against]:.3f} |",
              flush=True)
    print(f"today / {a.against}: {min(ratios):.3f} to {max(ratios):.3f} over {len(ratios)} shapes "
          f"(above 1: today is faster)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
