#!/usr/bin/env bash
# GPU call 9 of session 43: scripts/wave_tail.py — stages 6 and 7 at B1 H31-35 S8192 D128 full
# (15.03 to 16.97 waves of work tiles on 132 SMs): does a partial last wave cost a whole one?
# Stage 6's persistent blocks are predicted to (not measured before), stage 7 with its split not.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s43call9
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step waves 300 python3 scripts/wave_tail.py --heads 31 32 33 34 35 --out $L/wave_tail.json
cut -c1-300 $L/waves.log
tar czf $OUT/run.tgz $L
