#!/usr/bin/env bash
# GPU call 3 of session 44: does a settle before each batch (lib.timing's settle_ms: the
# callable's own untimed runs) take away the place effect call 2 found at B2 H32 S8192 D128?
# scripts/place_probe.py with 0, 50 and 150 ms, every order of stage 6, SDPA default and FLASH.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s44call3
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step settle 400 python3 scripts/place_probe.py --settle-ms 0 50 150 --shapes 2 --out $L/settle.json
grep -E "^B" $L/settle.log | cut -c1-250
tar czf $OUT/run.tgz $L
