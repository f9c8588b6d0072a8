#!/usr/bin/env bash
# GPU call 5 of session 27 (2026-11-24) at commit 8a2314b (stage sources as in calls 2-4): stage 6
# re-recorded, and generate() against SDPA recorded (scripts/generate_record.py --record).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=8a2314b
OUT=$OUT bash scripts/record_stages.sh 300 6
timeout 200 python3 scripts/generate_record.py --record > $OUT/generate.log 2>&1; echo "generate rc=$?"
grep "^|" $OUT/generate.log
tar czf $OUT/run.tgz results README.md
