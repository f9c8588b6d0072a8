#!/usr/bin/env bash
# GPU call 4 of session 34: three Q buffers (Q_STAGES=3) checked (test_q_buffers_match_reference
# and the shared suite's stage 6 rows) and timed against two at the short-prefill rows
# (qbuffers.py); then stage 6 after call 3's change profiled again at D64 causal S512 (Nsight
# Compute's source page), for what is left per work tile. Logs only.
set -u
D=$(dirname $0)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step tests 200 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py -k "q_buffer or work_queue or every_schedule"
grep -E "passed|failed|^FAILED" $OUT/logs/tests.log | cut -c1-240 | head -10
step qbuffers 200 python3 $D/qbuffers.py
cat $OUT/logs/qbuffers.log | cut -c1-240
step ncu 120 ncu --profile-from-start off --clock-control none --set full --import-source no -o /tmp/causal512 \
  python3 scripts/profile_pair.py 32 16 16 512 512 64 --causal
ncu -i /tmp/causal512.ncu-rep --page source --print-source sass --csv > $OUT/logs/causal512-sass.csv 2>&1
ncu -i /tmp/causal512.ncu-rep --page details --section WarpStateStats --section SpeedOfLight --print-details all > $OUT/logs/causal512-stalls.txt 2>&1
grep -E "^  [a-z]|Duration|Stall (Wait|Long|Barrier|GMMA|MIO)" $OUT/logs/causal512-stalls.txt | cut -c1-150
tar czf $OUT/logs.tgz -C $OUT logs
