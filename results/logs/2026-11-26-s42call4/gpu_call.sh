#!/usr/bin/env bash
# GPU call 4 of session 42: the two records older than stage 6's sources, re-recorded at them: the
# idea-by-idea schedule record (scripts/stage6_schedules.py, last at edf711c) and generate() in
# the tiny Llama with stages 5 and 6 (scripts/generate_record.py, last at d2fd10f).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s42call4
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step schedules 330 python3 scripts/stage6_schedules.py --record
grep -E "SDPA default|intra-warpgroup|ping-pong|no warp|recorded|Error|error" $L/schedules.log | head -40 | cut -c1-220
step generate 180 python3 scripts/generate_record.py --record
tail -n 14 $L/generate.log | cut -c1-220
tar czf $OUT/run.tgz results/*.json results/*.png $L
