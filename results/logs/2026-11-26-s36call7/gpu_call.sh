#!/usr/bin/env bash
# GPU call 7 of session 36: (1) issue 21, how much of the shortest decoding calls is the launch
# (scripts/decode_floor.py; logs only); (2) the stage 7 and stage 8 notebooks executed against
# the results file, whose stage 6 rows call 4 re-recorded (their banners name them).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step floor 200 python3 scripts/decode_floor.py --out $OUT/logs/floor.json
grep -E "µs" $OUT/logs/floor.log | cut -c1-300
for nb in stage7_fp8 stage8_backward; do step nb-$nb 150 python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $OUT/logs/nb-$nb.log; done
tar czf $OUT/run.tgz notebooks/stage7_fp8.ipynb notebooks/stage8_backward.ipynb
