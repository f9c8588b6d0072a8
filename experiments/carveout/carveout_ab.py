"""Experiment (issue 21): does stage 6 lose time to the SM's shared-memory/L1 split?

An SM splits 256 KB between L1 and shared memory, and the driver picks the split for each
kernel: by default the smallest shared-memory size that holds the kernel's blocks (Nsight
Compute's "Shared Memory Configuration Size": 102 KB for stage 6 at D64 prefill, 168 KB for
its decoding build), while cuDNN's kernels ask for the most shared memory there is (233 KB)
through the preferred-carveout attribute. When two kernels in a row want different splits,
the SM must drain and re-split between them. Nsight Compute showed stage 6's decoding kernel
at B8 H8/1 Sk1024 D64 with 19.1k cycles elapsed but about 10.6k of them with a block resident
(results/logs/2026-11-25-82528f2-h100), where cuDNN's two kernels each took about 4.2k cycles
more than their blocks ran.

This times stage 6 with its kernels' preferred carveout left to the driver and set to the
most shared memory (CU_SHAREDMEM_CARVEOUT_MAX_SHARED), against SDPA's default, in interleaved
rounds at the rows of the recorded shape map where stage 6 is furthest below SDPA; each call
sets its carveout on the kernels it launches just before launching them. Two settings of
what runs before each timed call:
  flush   the harness's own L2 flush (a fill kernel), as every recorded row;
  gemm    a bf16 matrix product (4096 × 4096 × 1024 through cuBLAS, as a model's projection
          before its attention) and then the flush.
Logs only (--out): nothing is recorded.

    python experiments/carveout/carveout_ab.py --out carveout.json
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

from lib import results as R  # noqa: E402
from lib import timing  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.timing import sdpa_call, time_interleaved  # noqa: E402
from stages import stage6  # noqa: E402

# (B, H, H_kv, Sq, Sk, D, causal): the recorded map's lowest rows (4e746b2, bf16), two controls
ROWS = [(8, 8, 1, 1, 1024, 64, False), (8, 8, 1, 1, 4096, 64, False), (64, 32, 8, 1, 1024, 64, False),
        (1, 8, 1, 1, 4096, 128, False), (8, 8, 1, 1, 1024, 128, False), (1, 8, 1, 1, 32768, 128, False),
        (32, 16, 16, 512, 512, 64, True), (16, 16, 16, 1024, 1024, 64, True), (32, 32, 32, 512, 512, 128, False),
        (32, 16, 16, 512, 512, 64, False), (4, 32, 32, 4096, 4096, 128, True), (64, 32, 8, 1, 32768, 128, False)]


def set_carveout(value: int) -> None:
    """The preferred carveout of every stage 6 kernel loaded so far (attention and combine)."""
    from cuda.bindings import driver
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    dev = torch.cuda.current_device()
    for pair in stage6._kernels.values():
        for kern in pair:
            (err,) = driver.cuKernelSetAttribute(attr, value, kern.handle, dev)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuKernelSetAttribute(carveout={value}): {err}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write every timing, with the env, as JSON")
    ap.add_argument("--budget-s", type=float, default=0.3, help="seconds of timing per callable (default 0.3)")
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: times stage 6 (sm_90a), so it needs an H100 or H200 and none was found\n")
    from cuda.bindings import driver
    default, most = -1, int(driver.CUshared_carveout.CU_SHAREDMEM_CARVEOUT_MAX_SHARED)
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
    flush = timing.flush_l2
    rows = []
    for B, H, Hk, Sq, Sk, D, causal in ROWS:
        q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=torch.bfloat16)
        stage6.attention(q, k, v, causal=causal)  # compiled and planned: its kernels are loaded
        sdpa = sdpa_call(q, k, v, causal=causal)

        def s6(value):
            def call():
                set_carveout(value)
                stage6.attention(q, k, v, causal=causal)
            return call
        got = {}
        for before in ("flush", "gemm"):
            # the harness flushes L2 before each run; "gemm" puts a cuBLAS product ahead of that
            timing.flush_l2 = flush if before == "flush" else (lambda: (x @ w, flush()))
            try:
                t = time_interleaved({"driver's carveout": s6(default), "most shared memory": s6(most),
                                      "SDPA default": sdpa}, budget_s=a.budget_s)
            finally:
                timing.flush_l2 = flush
            got[before] = {name: r.median_us for name, r in t.items()}
            got[before + "_rounds"] = {name: r.round_medians_us for name, r in t.items()}
        set_carveout(default)
        row = {"B": B, "H": H, "Hkv": Hk, "Sq": Sq, "Sk": Sk, "D": D, "causal": causal, **got}
        rows.append(row)
        for before in ("flush", "gemm"):
            us = got[before]
            drv, most_us, sd = us["driver's carveout"], us["most shared memory"], us["SDPA default"]
            print(f"B{B} H{H}/{Hk} Sq{Sq} Sk{Sk} D{D} {'causal' if causal else 'full'} [{before}]: driver's "
                  f"{drv:.1f} µs, most shared {most_us:.1f} µs ({drv / most_us:.3f}×), SDPA {sd:.1f} µs; "
                  f"vs SDPA {sd / drv:.2f}× → {sd / most_us:.2f}×", flush=True)
    gains = [r[b]["driver's carveout"] / r[b]["most shared memory"] for r in rows for b in ("flush", "gemm")]
    print(f"most shared memory against the driver's choice: {min(gains):.3f}× to {max(gains):.3f}×, "
          f"median {statistics.median(gains):.3f}× over {len(gains)} row-settings")
    if a.out:
        a.out.write_text(json.dumps({"env": R.capture_env(), "budget_s": a.budget_s, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
