#!/usr/bin/env bash
# GPU call 9 of session 44 (run twice, the second time verbose, with skip reasons): lib.timing's tests on the GPU (the settle's untimed runs and the rotated
# rounds counted; the slow-spell test without a settle), and the rest of tests/test_lib.py.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s44call9
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step testlib 240 python3 -m pytest -v -rfs -p no:cacheprovider tests/test_lib.py
grep -E "settle|interleaved|SKIPPED|passed|failed" $L/testlib.log | cut -c1-200 | head -20
tar czf $OUT/run.tgz $L
