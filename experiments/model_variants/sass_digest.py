"""SHA-256 of `cuobjdump -sass` and ptxas's usage for the D64/D128 builds the launcher's rules pick
(experiments/model_variants/variant_builds.py's shapes, every variant set, with and without SEQS),
compiled offline from the tree this script sits in. Run it in two trees and diff the output to
check that a change leaves those builds byte-identical (issue 51's head dims: D96 and D256 must not
touch D64/D128):

    python3 experiments/model_variants/sass_digest.py > new.txt
    (cd /path/to/base-tree && FA_CACHE_DIR=/tmp/base-cache python3 experiments/model_variants/sass_digest.py) > base.txt
    diff base.txt new.txt    # nothing: the same SASS

(the base tree needs this script copied in, e.g. `git archive <commit> | tar -x -C /tmp/base`). CPU only."""
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import stages.stage6 as s6  # noqa: E402
from lib import nvrtc, sass  # noqa: E402
from variant_builds import builds_of, variant_sets  # noqa: E402


def main():
    seen = {}
    for D in (64, 128):
        for dtype in (torch.float16, torch.bfloat16):
            for seqs in (False, True):
                for var in variant_sets(dtype).values():
                    for defines in builds_of(D, dtype, var, seqs):
                        seen[(D, str(dtype)[6:], defines)] = None
    builds = [nvrtc.Build(s6.SOURCE, s6.ARCH, getattr(torch, dt), D, defines) for D, dt, defines in seen]
    nvrtc.compile_many(builds)
    for (D, dt, defines), b in sorted(zip(seen, builds), key=lambda x: repr(x[0])):
        c = b.compile()
        digest = hashlib.sha256(sass.sass_text(c.cubin).encode()).hexdigest()[:16]
        usage = c.resource_usage()["attention_wgmma"]
        print(f"D{D} {dt} {' '.join(f'{k}={v}' for k, v in defines)}: {digest} "
              f"regs {usage['registers']} spills {usage['spill_stores']}/{usage['spill_loads']}")
    print(f"{len(seen)} builds", file=sys.stderr)


if __name__ == "__main__":
    main()
