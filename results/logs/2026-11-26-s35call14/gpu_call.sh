#!/usr/bin/env bash
# GPU call 14 of session 35: stage 8's record with bf16 and fp16 rows (the issue asks for both;
# the sources are call 13's), the training record, and
# the stage 8 and journey notebooks executed against them.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step backward 300 python3 scripts/backward_bench.py --record --variants --rounds 5
grep -E "^\| B|recorded|not recorded" $OUT/logs/backward.log | cut -c1-200
step train 60 python3 scripts/train_curve.py --record; tail -1 $OUT/logs/train.log
for nb in stage8_backward journey; do step nb-$nb 150 python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $OUT/logs/nb-$nb.log; done
tar czf $OUT/run.tgz results/*.json results/*.png notebooks/stage8_backward.ipynb notebooks/journey.ipynb
