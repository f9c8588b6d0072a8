#!/usr/bin/env bash
# GPU call 4 of session 44: records again, now that lib.timing settles each batch (SETTLE_MS, 50 ms
# of the callable's own untimed runs) and rotates each round's order, and with SKIP_ROWS_PAST_END
# in stages 6 and 7: stage 6's standard rows and sweep (fp16, bf16), stage 7's bench, the training
# record (its hashes include stage 6's), stage 7's waterfall while time is left.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s44call4
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step bench 240 python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 --stages 6
grep -A8 "^| stage | shape | dtype | causal | µs" $L/bench.log | head -10 | cut -c1-200; tail -1 $L/bench.log | cut -c1-250
step fp8bench 180 python3 scripts/fp8_bench.py --record --out $L/fp8_bench.json
grep -E "^\| B|ceilings|recorded|FAIL" $L/fp8bench.log | cut -c1-300
step train 100 python3 scripts/train_curve.py --record; tail -2 $L/train.log | cut -c1-200
left=$(( 585 - ($(date +%s) - T0) ))
echo "waterfall: $left s left"
[ $left -gt 60 ] && { step waterfall $left python3 scripts/fp8_waterfall.py --record --out $L/fp8_waterfall.json; grep -E "recorded|FAIL" $L/waterfall.log; }
tar czf $OUT/run.tgz results/*.json results/*.png README.md $L
