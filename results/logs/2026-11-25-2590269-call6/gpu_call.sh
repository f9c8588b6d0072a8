#!/usr/bin/env bash
# GPU call 6 of session 31 (2026-11-25) at commit 2590269: call 5's GPU suite failed 3 tests: the WMMA offline compile (an empty NVRTC log, now CPU-only) and stage 5 bottom-right at B1 H2/1 Sq300 Sk1 fp16 with one seed — replayed here 50 times (replay.py). Then stage 6's rows re-recorded and the training record (stage 6's first step now too).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=2590269
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step replay 90 python3 $(dirname $0)/replay.py; cat $OUT/replay.log | cut -c1-400
step bench6 220 python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 --stages 6
grep -A10 "^| stage | shape" $OUT/bench6.log | head -16
step train 200 python3 scripts/train_curve.py --record
grep -E "first step|after|seed|recorded|not recorded" $OUT/train.log | cut -c1-200
tar czf $OUT/run.tgz results notebooks README.md
