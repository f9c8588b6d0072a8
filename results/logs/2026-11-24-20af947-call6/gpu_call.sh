#!/usr/bin/env bash
# GPU call 6 of session 27 (2026-11-24) at commit 20af947: stage 6 with per-sequence offsets and key
# lengths as a build of its own (SEQS). Its GPU tests (bottom-right, varlen, seqlens_k, schedules,
# graphs), the two builds timed against each other (scripts/seqs_ab.py), stage 6 re-recorded, and
# generate() re-recorded (its stage 6 rows ran the previous build).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=20af947
timeout 150 python3 -m pytest -p no:cacheprovider -q -n 8 tests/test_stage6.py tests/test_causal_varlen.py tests/test_stages.py tests/test_hf.py -k "6 or varlen or generate" > $OUT/pytest.log 2>&1; echo "pytest rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest.log | tail -8
timeout 150 python3 scripts/seqs_ab.py > $OUT/seqs_ab.log 2>&1; echo "seqs_ab rc=$?"; cat $OUT/seqs_ab.log | tail -12
OUT=$OUT bash scripts/record_stages.sh 170 6
timeout 120 python3 scripts/generate_record.py --record > $OUT/generate.log 2>&1; echo "generate rc=$?"
grep "^|" $OUT/generate.log
tar czf $OUT/run.tgz results README.md
