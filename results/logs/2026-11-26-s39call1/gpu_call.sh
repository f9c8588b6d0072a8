#!/usr/bin/env bash
# GPU call 1 of session 39 (issue 25): stage 7's ROW_SUM_MMA build (row sums from P·V through a
# row of ones under Vᵀ) checked by the stage 7 tests that run it, then timed against the default
# (rowsum_ab.py), with the SM clock and power sampled every 100 ms beside it (smi.csv).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s39call1
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv,noheader
step tests 240 python3 -m pytest -q -x -n 8 -p no:cacheprovider tests/test_stage7.py -k "row_sum or matches_emulation or every_schedule"; tail -3 $OUT/logs/tests.log
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 100 > $OUT/logs/smi.csv 2>&1 &
smi=$!
step rowsum 300 python3 $here/rowsum_ab.py; grep -E "^B|Error" $OUT/logs/rowsum.log
kill $smi
cd $OUT && tar czf run.tgz logs
