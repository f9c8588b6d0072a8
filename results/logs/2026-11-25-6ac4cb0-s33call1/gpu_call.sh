#!/usr/bin/env bash
# GPU call 1 of session 33 (2026-11-25): stage 7's first run on a GPU (the loop probe, then its
# tests on 8 processes, no -x, so every failing build shows), then issue 21's decoding
# experiment (split counts x combine placement at the decode rows below SDPA).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 90 python3 scripts/fp8_loop_probe.py > $OUT/fp8probe.log 2>&1; echo "fp8probe rc=$?"; tail -20 $OUT/fp8probe.log | cut -c1-200
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
timeout 220 python3 -m pytest -q -rf "${par[@]}" tests/test_stage7.py > $OUT/fp8tests.log 2>&1; echo "fp8tests rc=$?"
grep -E "passed|failed|FAILED|Error" $OUT/fp8tests.log | cut -c1-220 | head -40
timeout 250 python3 scripts/shape_map.py --parts splits --dtype bfloat16 --budget-s 200 --out $OUT/splits.json > $OUT/splits.log 2>&1; echo "splits rc=$?"
tail -60 $OUT/splits.log | cut -c1-200
