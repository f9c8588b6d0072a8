#!/usr/bin/env bash
# GPU call 7 of session 43: finer pieces at D64 (tail_split_ab.py --pieces): call 6 had every SM
# take one of the rule's 3 pieces per tail tile after its 21 whole tiles, the kernel ending at 443
# µs against 446 unsplit; with 6 or 8 pieces per tail tile the queue can give more to the SMs
# that finish first. Each variant checked against the emulation before and after timing.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s43call7
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step pieces 240 python3 scripts/tail_split_ab.py --head-dims 64 --pieces 6 8 --out $L/pieces.json
cut -c1-700 $L/pieces.log
tar czf $OUT/run.tgz $L
