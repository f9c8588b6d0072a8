#!/usr/bin/env bash
# GPU call 2 of session 34: (1) the shared-memory carveout experiment (scripts/carveout_ab.py, issue
# 21's lowest rows); (2) where the warps of stage 6 and cuDNN stall, instruction by instruction
# (Nsight Compute's source page, SASS) at D64 causal S512 and at the decode row B8 H8/1 Sk1024 D64,
# and stage 7 alone at D64 S2048. Logs only.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step carveout 240 python3 scripts/carveout_ab.py --out $OUT/logs/carveout.json
grep -E "µs|median" $OUT/logs/carveout.log | cut -c1-230
NCU=(ncu --profile-from-start off --clock-control none --set full --import-source no)
prof() {  # name, profile_pair arguments
  local name=$1; shift
  step ncu-$name 150 "${NCU[@]}" -o $OUT/logs/$name python3 scripts/profile_pair.py "$@"
  ncu -i $OUT/logs/$name.ncu-rep --page details --section WarpStateStats --section SchedulerStats --print-details all > $OUT/logs/$name-stalls.txt 2>&1
  ncu -i $OUT/logs/$name.ncu-rep --page source --print-source sass --csv > $OUT/logs/$name-sass.csv 2>&1
  echo "$name: $(wc -l < $OUT/logs/$name-sass.csv) sass rows; $(head -c 300 $OUT/logs/$name-sass.csv | head -2 | cut -c1-200)"
}
prof causal512 32 16 16 512 512 64 --causal
prof decode8 8 8 1 1 1024 64
prof fp8d64 16 16 16 2048 2048 64 --stage 7 --no-sdpa
step timeline 60 python3 scripts/shape_map.py --parts timeline --dtype bfloat16 --out $OUT/logs/timeline.json
grep -hE "^  [a-zA-Z_]|Stall|stall" $OUT/logs/*-stalls.txt | cut -c1-160 | head -80
mkdir -p /tmp/reps; mv $OUT/logs/*.ncu-rep /tmp/reps/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs
ls -la $OUT/logs | head -30
