#!/usr/bin/env bash
# GPU call 3 of session 33 (2026-11-25): stage 6 re-recorded in the table (its split constants
# changed: COMBINE_TILES, COMBINE_IN_BLOCK_BYTES), then the notebooks that read what changed
# executed (stage 6's decoding section, stage 7's record and GPU check, the journey, the introduction).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=99e7059
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step bench 240 python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 --stages 6
grep -A8 "^| stage | shape | dtype | causal | µs" $OUT/bench.log | head -12 | cut -c1-200
for nb in stage6_wgmma_tma stage7_fp8 journey 00_introduction; do step nb-$nb 100 python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -2 $OUT/nb-$nb.log | cut -c1-200; done
tar czf $OUT/run.tgz results notebooks README.md
