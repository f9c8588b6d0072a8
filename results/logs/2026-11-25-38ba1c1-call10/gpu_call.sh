#!/usr/bin/env bash
# GPU call 10 of session 31 (2026-11-25) at commit 38ba1c1: the training record again (stage 5 changed after call 6: the barrier fix), the shape map re-recorded at today's stage 6, then the stage 8 notebook executed.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=38ba1c1
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step train 90 python3 scripts/train_curve.py --record
grep -E "first step|after|recorded|not recorded" $OUT/train.log | cut -c1-200
step shape_map 330 python3 scripts/shape_map.py --record --dtype bfloat16
tail -n 5 $OUT/shape_map.log | cut -c1-200
step nb-stage8_backward 60 python3 -m lib.notebook --execute notebooks/stage8_backward.ipynb
tar czf $OUT/run.tgz results notebooks README.md
