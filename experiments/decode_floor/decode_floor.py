"""Experiment (issue 21): how much of the shortest decoding calls is the launch itself?

The decode rows still under SDPA after two blocks per SM are the shortest calls (B1 and B8 with
one K/V head, 1,024 keys: 10-15 µs, 8 or 64 blocks of one key tile each). Nsight Compute found
stage 6's one launch there elapsed 19.1k cycles with a block resident for about 10.6k of them,
where each of cuDNN's two kernels was resident for all but about 4.2k
(results/logs/2026-11-25-82528f2-h100). This times, in the same interleaved rounds and with the
harness's L2 flush before each run (as every recorded row):

- empty kernels (each block returns at once) launched as stage 6's decoding blocks are (256
  threads, the decode build's 148 KB of dynamic shared memory, its four tensor maps as
  __grid_constant__ parameters), and as cuDNN's are (128 threads, 45 KB, no maps), and the
  steps between: the floor each kind of launch pays before any work;
- stage 6 and SDPA's default backend at the lowest decode rows, with the flush and without it
  (back-to-back calls: code, tensor maps and the partial rows' lines still in L2).

Predicted: the launch floors differ by well under a microsecond (the launch path does not read
shared-memory sizes or parameter bytes for long), so the gap is in the blocks' own work; and
without the flush stage 6 gains more than SDPA (its 69 KB of code and its maps come from DRAM
after a flush). Measured (results/logs/2026-11-26-fcdad3f-h100/floor.log): the
first, yes (3.73-3.89 µs for every launch shape); the second, no: without the flush both sides
gained alike (B8 H8/1 Sk1024 D64: 0.911x of SDPA either way), so the gap is in the blocks' work.
Logs only (--out).

    python experiments/decode_floor/decode_floor.py --out floor.json
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

import stages.stage6 as s6  # noqa: E402
from lib import nvrtc  # noqa: E402
from lib import results as R  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.timing import sdpa_call, time_interleaved  # noqa: E402

EMPTY = r"""
struct alignas(64) CUtensorMap { unsigned long long opaque[16]; };  // as stages/hopper.cuh declares it
extern "C" __global__ void empty(int* flag) {
    if (flag != nullptr && threadIdx.x == 0 && blockIdx.x == 0x7fffffff) *flag = 1;
}
extern "C" __global__ void empty_maps(const __grid_constant__ CUtensorMap a, const __grid_constant__ CUtensorMap b,
                                      const __grid_constant__ CUtensorMap c, const __grid_constant__ CUtensorMap d,
                                      int* flag) {
    if (flag != nullptr && threadIdx.x == 0 && blockIdx.x == 0x7fffffff) *flag = 1;
}
"""
ROWS = [(1, 8, 1, 1, 1024, 64), (8, 8, 1, 1, 1024, 64), (8, 8, 1, 1, 1024, 128), (8, 8, 1, 1, 4096, 64)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write every timing, with the env, as JSON")
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: times stage 6 (sm_90a), so it needs an H100 or H200 and none was found\n")
    compiled = nvrtc.compile_cuda(EMPTY, arch="sm_90a", name="empty.cu")
    smem = s6.config(64, s6.DECODE_TILES[64], s6.DECODE_SCHEDULE, pack_gqa=True)["smem"]
    empty = nvrtc.load_kernel(compiled, "empty", max_dynamic_smem=smem)
    empty_maps = nvrtc.load_kernel(compiled, "empty_maps", max_dynamic_smem=smem)
    q, k, v = make_qkv(1, 8, 1, 64, Sk=1024, Hkv=1, dtype=torch.bfloat16)
    maps = [s6.tensor_map(t, rows) for t, rows in ((k, 128), (k, 128), (v, 128), (v, 128))]

    def launch(kernel, grid, threads, nbytes, with_maps=False):
        cfg = nvrtc.launch_config((grid, 1, 1), (threads, 1, 1), nbytes)
        args = (*maps, 0) if with_maps else (0,)
        return lambda: nvrtc.launch_prepared(kernel, cfg, args)

    out = {"env": R.capture_env(), "decode_smem": smem, "rows": []}
    for grid in (8, 64):
        fns = {"cuDNN-like: 128 threads, 45 KB": launch(empty, grid, 128, 45 * 1024),
               "256 threads, no shared memory": launch(empty, grid, 256, 0),
               f"256 threads, {smem // 1024} KB": launch(empty, grid, 256, smem),
               f"256 threads, {smem // 1024} KB, four tensor maps": launch(empty_maps, grid, 256, smem, True)}
        t = time_interleaved(fns, budget_s=0.3)
        for name, r in t.items():
            out["rows"].append({"kind": "empty", "grid": grid, "launch": name, "us": r.median_us})
            print(f"empty kernel, {grid} blocks, {name}: {r.median_us:.2f} µs", flush=True)
    for B, H, Hkv, Sq, Sk, D in ROWS:
        q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=torch.bfloat16)
        stage = lambda: s6.attention(q, k, v)  # noqa: E731
        sdpa = sdpa_call(q, k, v)
        got = {}
        for flush in (True, False):
            t = time_interleaved({"stage 6": stage, "SDPA": sdpa}, budget_s=0.3, flush=flush)
            got[flush] = {n: r.median_us for n, r in t.items()}
            out["rows"].append({"kind": "call", "B": B, "H": H, "Hkv": Hkv, "Sq": Sq, "Sk": Sk, "D": D,
                                "flush": flush, **{f"{n} us": u for n, u in got[flush].items()}})
        print(f"B{B} H{H}/{Hkv} Sk{Sk} D{D}: flushed stage 6 {got[True]['stage 6']:.2f} µs, SDPA {got[True]['SDPA']:.2f} "
              f"({got[True]['SDPA'] / got[True]['stage 6']:.3f}x); unflushed stage 6 {got[False]['stage 6']:.2f}, "
              f"SDPA {got[False]['SDPA']:.2f} ({got[False]['SDPA'] / got[False]['stage 6']:.3f}x)", flush=True)
    if a.out:
        a.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
