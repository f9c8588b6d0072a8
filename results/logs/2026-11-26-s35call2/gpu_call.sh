#!/usr/bin/env bash
# GPU call 2 of session 35: compute-sanitizer on stage 8's builds again, filtered to this repo's
# kernels (call 1's reports were all in cuDNN's kernels, which the gradient check runs as its
# baseline, and in driver API probes); then where the warps of stage 8's fused build (two
# warpgroups, dQ by reductions) and of cuDNN's backward stall, instruction by instruction.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
for tool in racecheck memcheck synccheck; do
  step sanitize-$tool 150 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention --report-api-errors no python3 results/logs/2026-11-26-s35call1/calls.py; tail -2 $OUT/logs/sanitize-$tool.log
done
NCU=(ncu --profile-from-start off --clock-control none --set full --import-source no)
prof() {  # name, profile_backward arguments
  local name=$1; shift
  step ncu-$name 150 "${NCU[@]}" -o $OUT/logs/$name python3 scripts/profile_backward.py "$@"
  ncu -i $OUT/logs/$name.ncu-rep --page details --print-details all > $OUT/logs/$name-details.txt 2>&1
  ncu -i $OUT/logs/$name.ncu-rep --page source --print-source sass --csv > $OUT/logs/$name-sass.csv 2>&1
  gzip -f $OUT/logs/$name-sass.csv
}
prof fused128 2 16 4096 128 --warpgroups 2 --dq-atomics 1
prof fused64 8 16 2048 64 --warpgroups 2 --dq-atomics 1 --no-sdpa
prof pass128 2 16 4096 128 --warpgroups 1 --dq-atomics 0 --no-sdpa
grep -hE "^  [a-zA-Z_]|Duration|Stall|Registers|Achieved Occ|Throughput" $OUT/logs/*-details.txt | cut -c1-160 | head -120
rm -f $OUT/logs/*.ncu-rep
