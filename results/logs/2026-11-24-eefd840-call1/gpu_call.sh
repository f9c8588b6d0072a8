#!/usr/bin/env bash
# GPU call 1 of session 27 (2026-11-24) at commit eefd840 (issue 22: bottom-right causal in stages
# 2–6, packed sequences in 5 and 6, stage 6's seqlens_k, the HF adapter with padding and caches):
# the whole GPU test suite (the freshness test deselected: the stages are re-recorded in the next
# calls), compute-sanitizer memcheck on lib.bench --check (bottom-right and varlen included) for
# stages 2–6 and racecheck for stage 6, and generate() against SDPA (not recorded yet).
# Wheels: bash ../shared/h100/fetch-wheels.sh .whl transformers; rm .whl/debugpy-* .whl/hf_xet-*
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=eefd840
nvidia-smi -L
timeout 300 python3 -m pytest -p no:cacheprovider -q -n 8 tests/ --deselect tests/test_freshness.py::test_recorded_results_match_current_sources > $OUT/pytest.log 2>&1; echo "pytest rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest.log | tail -25
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 --kernel-name kns=attention --report-api-errors no python3 -m lib.bench --check --stages 2 3 4 5 6 > $OUT/memcheck.log 2>&1; echo "memcheck rc=$?"
grep -E "FAIL|ERROR SUMMARY|checks" $OUT/memcheck.log | tail -5
timeout 100 compute-sanitizer --tool racecheck --error-exitcode 9 --kernel-name kns=attention --report-api-errors no python3 -m lib.bench --check --stages 6 > $OUT/racecheck.log 2>&1; echo "racecheck rc=$?"
grep -E "FAIL|ERROR SUMMARY|RACECHECK SUMMARY|checks" $OUT/racecheck.log | tail -5
timeout 120 python3 scripts/generate_record.py --rounds 1 > $OUT/generate.log 2>&1; echo "generate rc=$?"
grep "^|" $OUT/generate.log
