"""SHA-256 of `cuobjdump -sass` and ptxas's usage for stage 8's Hopper builds (stages/stage8_wgmma.cu:
the stage's build per head dim and dtype, the dQ pass, and each of its switches alone), compiled
offline from the tree this script sits in; `--variants` adds the SOFTCAP/WINDOW builds (branch
bwd-variants). Run it in two trees and diff the output to check that a change leaves the builds
without variants byte-identical:

    python3 experiments/model_variants/sass_digest_backward.py > new.txt
    (cd /path/to/base-tree && FA_CACHE_DIR=/tmp/base-cache python3 experiments/model_variants/sass_digest_backward.py) > base.txt
    diff base.txt new.txt    # nothing: the same SASS

CPU only."""
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import stages.stage8 as s8  # noqa: E402
from lib import nvrtc, sass  # noqa: E402

SWITCH_SETS = [{}, {"dq_atomics": 0}, {"overlap": 0}, {"overlap": 1}, {"tma_loads": 0}, {"dq_bulk": 0}]


def builds(variants: bool):
    out = {}
    for D in (64, 128):
        for dtype in (torch.float16, torch.bfloat16):
            for sw in SWITCH_SETS:
                extra = [{}]
                if variants:
                    extra += [{"softcap": 1}, {"softcap": 2}, {"window": True}, {"softcap": 2, "window": True}]
                for var in extra:
                    try:
                        cfg = s8.config(D, None, sw.get("dq_atomics"), 1,
                                        **{k: v for k, v in sw.items() if k != "dq_atomics"}, **var)
                    except (ValueError, TypeError):
                        continue
                    out[(D, str(dtype)[6:], cfg["defines"])] = dtype
    return out


def main():
    seen = builds("--variants" in sys.argv)
    for (D, dt, defines), dtype in sorted(seen.items(), key=lambda x: repr(x[0])):
        c = nvrtc.compile_stage(s8.WGMMA_SOURCE, arch="sm_90a", dtype=dtype, head_dim=D, defines=dict(defines))
        digest = hashlib.sha256(sass.sass_text(c.cubin).encode()).hexdigest()[:16]
        use = c.resource_usage()
        parts = " ".join(f"{k}: regs {u['registers']} spills {u['spill_stores']}/{u['spill_loads']}"
                         for k, u in sorted(use.items()))
        print(f"D{D} {dt} {' '.join(f'{k}={v}' for k, v in defines)}: {digest} {parts}")
    print(f"{len(seen)} builds", file=sys.stderr)


if __name__ == "__main__":
    main()
