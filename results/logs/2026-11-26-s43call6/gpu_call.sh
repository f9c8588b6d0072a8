#!/usr/bin/env bash
# GPU call 6 of session 43: where the split's time goes (scripts/queue_tail_probe.py --split):
# each work tile's and each piece's SM, start and end, at issue 25's two standard shapes, with and
# without TAIL_SPLIT (at D64 it ran 0.992-0.995x of the build without, though 2.8% of the SM
# time idles at the end there).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s43call6
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step probe-whole 120 python3 scripts/queue_tail_probe.py --out $L/queue_tail_whole.json; cut -c1-500 $L/probe-whole.log
step probe-split 120 python3 scripts/queue_tail_probe.py --split --out $L/queue_tail_split.json; cut -c1-500 $L/probe-split.log
tar czf $OUT/run.tgz $L
