"""One stage at one shape, as an earlier commit built it and as it is now, timed side by side on
this GPU: settles whether a recorded slowdown belongs to the kernel or to the run that recorded it.

    python experiments/kernel_or_run/then_and_now.py 4506624 3 long              # stage 3 at B4 H16 S8192 D128
    python experiments/kernel_or_run/then_and_now.py 4506624 3 long --rounds 3 --dtype bfloat16

The earlier tree is `git archive COMMIT` (or --tree DIR, a copy made elsewhere). Each round times
the earlier build, then the current one, each in a fresh process that imports only that tree's
`stages` (so neither sees the other's code or kernel cache), with the same method as the
benchmark: CUDA events, L2 flushed before each call, median; SDPA's default backend is timed in
the same process as a yardstick for the machine. Prints one line per measurement and a summary;
--json writes them.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from lib.bench import STANDARD_SHAPES  # noqa: E402
from lib.simulator import HAS_GPU  # noqa: E402

# Runs inside each tree: nothing but torch and that tree's `stages`, so a tree of any age works.
TIMER = r"""
import json, statistics, sys, torch
import torch.nn.functional as F
import stages
n, B, H, S, D, dtype, causal, runs = json.loads(sys.argv[1])
dtype = getattr(torch, dtype)
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=g) for _ in range(3))
flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
attention = stages.get(n).attention
def median_us(fn):
    for _ in range(2):
        fn()
    times = []
    for _ in range(runs):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)
out = attention(q, k, v, causal=causal)
ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
err = (out.float() - ref.float()).abs().max().item()
print(json.dumps({"us": median_us(lambda: attention(q, k, v, causal=causal)),
                  "sdpa_us": median_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)),
                  "max_abs_err_vs_sdpa": err}))
"""


def old_tree(commit: str, dest: Path) -> Path:
    """`git archive` of the directories a stage needs at `commit`, unpacked into dest."""
    tar = dest / "tree.tar"
    with open(tar, "wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit, "stages", "lib"],
                       check=True, stdout=f)
    with tarfile.open(tar) as t:
        t.extractall(dest / "tree", filter="data")
    return dest / "tree"


def time_in(tree: Path, cache: Path, args: list) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "FA_CACHE_DIR": str(cache)}
    res = subprocess.run([sys.executable, "-c", TIMER, json.dumps(args)], cwd=tree, env=env,
                         capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"timing in {tree} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("commit", help="the earlier commit")
    ap.add_argument("stage", type=int)
    ap.add_argument("shape", choices=[s[0] for s in STANDARD_SHAPES])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=3, help="earlier, then current, this many times")
    ap.add_argument("--runs", type=int, default=20, help="timed calls per measurement (median)")
    ap.add_argument("--tree", type=Path, help="the earlier tree, already unpacked (default: git archive)")
    ap.add_argument("--json", type=Path, help="write the measurements here")
    a = ap.parse_args()
    if not HAS_GPU:
        ap.exit(2, f"{ap.prog}: times kernels, so it needs a CUDA GPU and none was found\n")
    _, B, H, S, D = next(s for s in STANDARD_SHAPES if s[0] == a.shape)
    args = [a.stage, B, H, S, D, a.dtype, a.causal, a.runs]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        trees = {a.commit: a.tree or old_tree(a.commit, tmp), "now": ROOT}
        rows = []
        for rnd in range(a.rounds):
            for name, tree in trees.items():
                r = {"build": name, "round": rnd, **time_in(tree, tmp / f"cache-{name}", args)}
                rows.append(r)
                print(f"round {rnd} {name:>10}: stage {a.stage} {r['us']:,.1f} µs, SDPA "
                      f"{r['sdpa_us']:,.1f} µs, max |err| vs SDPA {r['max_abs_err_vs_sdpa']:.2e}",
                      flush=True)
    print(f"\nstage {a.stage}, {a.shape} (B{B} H{H} S{S} D{D}) {a.dtype}"
          f"{' causal' if a.causal else ''}, median over {a.rounds} rounds:")
    for name in trees:
        us = statistics.median(r["us"] for r in rows if r["build"] == name)
        sd = statistics.median(r["sdpa_us"] for r in rows if r["build"] == name)
        print(f"  {name:>10}: {us:,.1f} µs (SDPA in the same processes: {sd:,.1f} µs)")
    if a.json:
        a.json.write_text(json.dumps({"commit": a.commit, "stage": a.stage, "shape": a.shape,
                                      "dtype": a.dtype, "causal": a.causal, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
