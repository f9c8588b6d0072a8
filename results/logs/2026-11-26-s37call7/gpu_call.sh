#!/usr/bin/env bash
# GPU call 7 of session 37 (issue 25): stage 7's quantization of 16-bit inputs by kernels of its
# own (stages/stage7_quantize.cu: each slab's amax, then the cast, V transposed into key order in
# the same pass), in place of lib.fp8.prepare + v_for_pv in PyTorch. Stage 7's tests (the bytes
# against prepare's), compute-sanitizer on the new kernels, then the FP8 record (fp8_bench.py:
# the kernels' and PyTorch's quantization timed in the same rounds) and the stage 7 and journey
# notebooks executed against it. Call 6 ran this script's first form: the descales came out one
# bit away from PyTorch's in some slabs (PyTorch multiplies by 1/448 where the kernel divided by
# 448; call 6's pytest-first.log), and with them some bytes. Its calls.py is the sanitizers'.
set -u
L=results/logs/2026-11-26-s37call6
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step pytest 150 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage7.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $OUT/logs/pytest.log | cut -c1-240 | head -8
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 80 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=fp8 --report-api-errors no python3 $L/calls.py; tail -1 $OUT/logs/sanitize-$tool.log
done
if [ $tests_rc -eq 0 ]; then
  step fp8bench 240 python3 scripts/fp8_bench.py --record --out $OUT/logs/fp8_bench.json
  grep -E "^\| B|ceilings|recorded|FAIL" $OUT/logs/fp8bench.log | cut -c1-230
  for nb in stage7_fp8 journey; do step nb-$nb 150 python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $OUT/logs/nb-$nb.log; done
fi
tar czf $OUT/run.tgz results/*.json results/*.png notebooks/stage7_fp8.ipynb notebooks/journey.ipynb
rm -f $OUT/logs/nb-*.log
