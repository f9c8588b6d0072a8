#!/usr/bin/env bash
# GPU call 1 of session 34 (2026-11-25): where the time goes at issue 21's worst rows and at stage
# 7's D64 row, against cuDNN's kernel (SDPA default) in the same process: Nsight Compute's full set
# on one call of each (scripts/profile_pair.py), then block 0's timeline at S 512 (shape_map.py
# --parts timeline). Logs only: nothing is recorded.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
NCU=(ncu --profile-from-start off --clock-control none --set full --import-source no)
step ncu-d64-causal-s512 120 "${NCU[@]}" python3 scripts/profile_pair.py 32 16 16 512 512 64 --causal
step ncu-d64-causal-s1024 120 "${NCU[@]}" python3 scripts/profile_pair.py 16 16 16 1024 1024 64 --causal
step ncu-d128-full-s512 120 "${NCU[@]}" python3 scripts/profile_pair.py 32 32 32 512 512 128
step ncu-decode-b8-h8-1-sk1024-d64 120 "${NCU[@]}" python3 scripts/profile_pair.py 8 8 1 1 1024 64
step ncu-decode-b64-h32-8-sk1024-d64 120 "${NCU[@]}" python3 scripts/profile_pair.py 64 32 8 1 1024 64
step ncu-fp8-d64-s2048 120 "${NCU[@]}" python3 scripts/profile_pair.py 16 16 16 2048 2048 64 --stage 7
step ncu-bf16-d64-s2048 120 "${NCU[@]}" python3 scripts/profile_pair.py 16 16 16 2048 2048 64 --no-sdpa
for f in $OUT/logs/ncu-*.log; do
  echo "== $f"; grep -E "^  [a-zA-Z_]+.*\(|Duration|Registers Per|Grid Size|Block Size|Dynamic Shared|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc Active" $f | cut -c1-150 | head -60
done
left=$(( 520 - ($(date +%s) - T0) ))
[ $left -gt 40 ] && step timeline $left python3 scripts/shape_map.py --parts timeline --dtype bfloat16 --out $OUT/logs/timeline.json
tail -n 20 $OUT/logs/timeline.log | cut -c1-220
tar czf $OUT/logs.tgz -C $OUT logs
