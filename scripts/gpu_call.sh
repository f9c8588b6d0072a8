#!/usr/bin/env bash
# One GPU call of a work session on a bare device machine: wheels first, then what the call needs.
#   bash scripts/gpu_call.sh STEP...     (steps: see the case below; e.g. bench-4-5 tiles shapemap)
#   bash scripts/gpu_call.sh lanes STEP... '|' STEP...
#       on a host of several GPUs: each '|'-separated list runs at the same time on its own GPU, in
#       its own copy of the tree (so each writes its own results file; lane N's comes back as
#       laneN/results/*.json, folded into the record here by `python -m lib.results --merge`).
#       Each record's env says which lane made it and what ran beside it.
# Logs under $OUT (default ./gpu-out). Every step runs even when one fails; the exit code says.
# FA_DEADLINE (seconds since the epoch): no step runs past it (a call's time limit), so the
# archive of what was done is always written.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
if [ -z "${FA_WHEELS_IN:-}" ]; then
  for w in .whl .whlnb; do
    if ls "$w"/*.whl > /dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$w"/*.whl || exit 1
    fi
  done
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_CACHE_DIR=${FA_CACHE_DIR:-/tmp/fa-cache}
if [ "${1:-}" = lanes ]; then
  shift
  IFS='|' read -ra LANES <<< "$*"
  pids=()
  for i in "${!LANES[@]}"; do
    d=/tmp/lane$i; rm -rf "$d"; mkdir -p "$d"
    tar cf - --exclude=./gpu-out --exclude=./.whl --exclude=./.whlnb --exclude=./.git . | tar xf - -C "$d"
    beside=$(for j in "${!LANES[@]}"; do [ "$j" = "$i" ] || printf '; GPU %s ran %s' "$j" "$(echo ${LANES[$j]})"; done)
    ( cd "$d" && CUDA_VISIBLE_DEVICES=$i FA_WHEELS_IN=1 OUT=$OUT/lane$i FA_CACHE_DIR=/tmp/fa-cache$i \
        FA_LANE="GPU $i of ${#LANES[@]} on one host, steps $(echo ${LANES[$i]})$beside at the same time" \
        bash scripts/gpu_call.sh ${LANES[$i]} > "$OUT/lane$i.txt" 2>&1
      r=$?; mkdir -p "$OUT/lane$i/results"; cp results/*.json "$OUT/lane$i/results/"; exit $r ) &
    pids+=($!)
  done
  rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
  for i in "${!LANES[@]}"; do echo "== lane $i:${LANES[$i]}"; grep -E "^== |rc=" "$OUT/lane$i.txt"; done
  tar czf /tmp/call.tgz -C "$OUT" --exclude call.tgz . && mv /tmp/call.tgz "$OUT/"  # not into the folder it reads
  exit $rc
fi
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
echo "commit ${FA_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}" | tee -a "$OUT/gpu.txt"
rc=0
step() { local name=$1; shift; echo "== $name: $*"; local t0=$(date +%s)
  local left=$(( ${FA_DEADLINE:-$(( t0 + 86400 ))} - t0 ))
  if [ "$left" -lt 20 ]; then echo "== $name not started: the call's deadline is ${left} s away"; rc=1; return; fi
  # a shell function (record_stages) keeps its own deadline: timeout runs programs only
  if declare -F "$1" > /dev/null; then "$@" > "$OUT/$name.log" 2>&1; else timeout "$left" "$@" > "$OUT/$name.log" 2>&1; fi
  local r=$?; tail -n 40 "$OUT/$name.log"
  echo "== $name rc=$r $(( $(date +%s) - t0 )) s"; [ $r -eq 0 ] || rc=1; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
# Re-record stages one by one within a budget of seconds: each stage is its own `lib.bench --record`
# run, so a limit reached mid-way loses only the stage then running, and a stage whose usual time
# no longer fits is not started. Usual times: the H200, 2026-11-29 (stage 0 369 s, stages 1-6
# 46-78 s; results/logs/2026-11-29-682414c-h200-lanes), plus slack.
record_stages() {
  local budget=$1; shift
  declare -A usual=([0]=420 [1]=100 [2]=100 [3]=100 [4]=100 [5]=100 [6]=100)
  local deadline=$(( $(date +%s) + budget )) s left t0 r failed=0
  [ -n "${FA_DEADLINE:-}" ] && [ "$FA_DEADLINE" -lt "$deadline" ] && deadline=$FA_DEADLINE
  for s in "$@"; do
    left=$(( deadline - $(date +%s) ))
    if [ "$left" -lt "${usual[$s]:-100}" ]; then
      echo "stage $s not started: ${left} s left, it usually takes ${usual[$s]:-100} s"; failed=1; continue
    fi
    t0=$(date +%s)
    timeout "$left" python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 \
      --stages "$s" > "$OUT/bench-stage$s.log" 2>&1
    r=$?; echo "stage $s rc=$r $(( $(date +%s) - t0 )) s"; [ $r -eq 0 ] || failed=1
  done
  # the notebooks that read re-recorded rows show older ones until executed again (on a GPU)
  echo "notebooks to execute again (python3 -m lib.notebook --execute-stale):"
  python3 -m lib.notebook --stale 2> /dev/null | sed 's/^/  /'
  return $failed  # the step's rc says whether every stage asked for was recorded
}
for s in "$@"; do case $s in
  probe52) step probe52 python3 experiments/gqa_one_key_backward/probe.py ;;
  host48) step host48 python3 experiments/train_step_host/probe.py --profile ;;
  hostbreak) step hostbreak python3 experiments/train_step_host/breakdown.py ;;
  fa3cases) step fa3cases python3 -m pytest -p no:cacheprovider -q "${par[@]}" tests/test_backward.py -k "flashattention3 or thread" ;;
  crash) step crash python3 -m pytest -p no:cacheprovider -q tests/test_backward.py -k thread ;;
  cache) step cache python3 -m pytest -p no:cacheprovider -q tests/test_kernel_cache.py ;;
  backward) step backward python3 -m pytest -p no:cacheprovider -q "${par[@]}" tests/test_backward.py ;;
  suite) step suite python3 -m pytest -p no:cacheprovider -q "${par[@]}" tests/test_backward.py tests/test_stage6.py tests/test_stages.py tests/test_kernel_cache.py tests/test_lib.py tests/test_causal_varlen.py ;;
  benchprof) step benchprof python3 -m cProfile -o "$OUT/bench.prof" -m lib.bench
             python3 -c "import pstats,sys; p=pstats.Stats(sys.argv[1]); p.sort_stats('cumulative').print_stats(45); p.sort_stats('tottime').print_stats(25)" "$OUT/bench.prof" > "$OUT/benchprof.txt" ;;
  bench) step bench-cold bash -c "time python3 -m lib.bench"; step bench-warm bash -c "time python3 -m lib.bench" ;;
  stages) step stages python3 -m pytest -p no:cacheprovider -q "${par[@]}" tests/test_stages.py tests/test_stage6.py tests/test_causal_varlen.py ;;
  overlap) step overlap python3 experiments/backward_overlap_d128/probe.py ;;
  stage6) step stage6 python3 -m pytest -p no:cacheprovider -q "${par[@]}" tests/test_stage6.py ;;
  all) step all python3 -m pytest -p no:cacheprovider -q "${par[@]}" ;;
  refactor) step refactor python3 -m pytest -p no:cacheprovider -q "${par[@]}" tests/test_backward.py tests/test_stage6.py \
              tests/test_stages.py tests/test_hf.py tests/test_lib_layers.py tests/test_train_map.py tests/test_causal_varlen.py ;;
  trainmap) step trainmap timeout 300 python3 scripts/backward_bench.py --train-step --record ;;
  bwdrecord) step bwdrecord timeout 420 python3 scripts/backward_bench.py --record --variants wgmma ;;
  bwdfeatures) step bwdfeatures timeout 400 python3 scripts/backward_bench.py --features --record ;;  # issue 51: the variants' backward
  headdims) step headdims python3 -m pytest -p no:cacheprovider -q "${par[@]}" tests/test_backward.py tests/test_backward_variants.py \
              tests/test_hf_variants.py -k "head_dim or (autograd_variants_train and (96 or 256)) or (training_step_in_tiny and (gemma2-256 or mistral-96))" ;;  # issue 51: stage 8 at D96, D256
  sanheaddims) for tool in memcheck racecheck synccheck; do
      step "san-headdims-$tool" compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention --report-api-errors no python3 experiments/backward_head_dims/sanitize.py
    done ;;
  hdrecord) step hdrecord timeout 200 python3 scripts/backward_bench.py --head-dims --record ;;  # about 45 s on an H200, compiled
  fixes) step fixes python3 -m pytest -p no:cacheprovider -q "${par[@]}" tests/test_backward.py -k "refused or flashattention3 or autograd or thread" ;;
  gqacausal) step gqacausal timeout 200 python3 experiments/gqa_causal_step/probe.py ;;
  sanvarlen) for tool in memcheck synccheck; do  # packed sequences' training path: per-sequence views at offsets
                step "sanitize-$tool" timeout 280 compute-sanitizer --tool "$tool" --error-exitcode 9 --kernel-name kns=attention \
                  --report-api-errors no python3 -m pytest -p no:cacheprovider -q "tests/test_backward.py::test_packed_sequences_train[6-128-bottom_right]" \
                  "tests/test_backward.py::test_packed_sequences_train[6-64-top_left]" "tests/test_backward.py::test_packed_sequences_train[5-64-False]" \
                  tests/test_backward.py::test_packed_sequences_train_from_strided_views ; done ;;
  spectests) step specdec-tests python3 -m pytest -p no:cacheprovider -q "${par[@]}" tests/test_stage6.py -k "decoding or split or producer" ;;
  specdec) step specdec timeout 200 python3 experiments/spec_decode_splits/probe.py ;;
  sanspec) for tool in memcheck racecheck synccheck; do
              step "sanitize-spec-$tool" timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 9 --kernel-name kns=attention \
                --report-api-errors no python3 experiments/spec_decode_splits/sanitize.py; done ;;
  sanvariants) for tool in memcheck racecheck synccheck; do  # stage 6's window, softcap and sinks (issue 51)
              step "sanitize-variants-$tool" timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 9 --kernel-name kns=attention \
                --report-api-errors no python3 experiments/model_variants/sanitize.py; done ;;
  paged) step paged python3 -m pytest -p no:cacheprovider -q "${par[@]}" tests/test_stage6_paged.py ;;  # issue 50
  pagedbench) step pagedbench timeout 540 python3 scripts/shape_map.py --paged --record ;;
  pagedideas) step pagedideas timeout 560 python3 scripts/shape_map.py --paged --paged-ideas --out "$OUT/paged_ideas.json" ;;  # issue 50 item 3: PAGE_IDS_AHEAD on/off, 16-key pages
  sanpaged) for tool in memcheck racecheck synccheck; do  # stage 6's paged KV cache (issue 50)
              step "sanitize-paged-$tool" timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 9 --kernel-name kns=attention \
                --report-api-errors no python3 experiments/paged_kv/sanitize.py; done ;;
  fp8kv) step fp8kv python3 -m pytest -p no:cacheprovider -q "${par[@]}" tests/test_stage6_fp8_kv.py ;;  # issue 50 item 2
  fp8kvbench) step fp8kvbench timeout 560 python3 scripts/shape_map.py --fp8-kv --record ;;
  sanfp8kv) for tool in memcheck racecheck synccheck; do  # stage 6 reading an e4m3 KV cache (issue 50 item 2)
              step "sanitize-fp8kv-$tool" timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 9 --kernel-name kns=attention \
                --report-api-errors no python3 experiments/fp8_kv_decode/sanitize.py; done ;;
  dims) step dims python3 -m pytest -p no:cacheprovider -q "${par[@]}" tests/test_stage6_head_dims.py ;;
  variants) step variants python3 scripts/stage6_schedules.py --features --record ;;
  windowtiles) step windowtiles timeout 300 python3 experiments/window_tiles/probe.py ;;  # issue 51: a window's key tiles at D128
  windowsched) step windowsched timeout 300 python3 experiments/window_schedule/probe.py ;;  # issue 51: a window's launch
  windowrule) step windowrule timeout 300 python3 experiments/window_schedule/probe.py --rule ;;
  windowvarlen) step windowvarlen python3 -m pytest -p no:cacheprovider -q "${par[@]}" tests/test_stage6_variants.py \
                  -k "window_launches_in_packed or variants_in_packed" ;;  # before packed sequences may take the window's launch
  fp8splits) step fp8splits timeout 200 python3 experiments/fp8_kv_decode/finer_splits.py ;;  # issue 50: e4m3 at D128, twice the splits
  nodeprobe) step nodeprobe timeout 240 python3 experiments/cpp_autograd_node/probe.py ;;
  node) step node python3 -m pytest -p no:cacheprovider -q "${par[@]}" tests/test_autograd_node.py tests/test_backward.py -k "node or autograd or thread or same_error or differentiable_once or flashattention3s" ;;
  bench0) step bench0 record_stages "${FA_BENCH_BUDGET:-540}" 0 ;;
  bench16) step bench16 record_stages "${FA_BENCH_BUDGET:-540}" ${FA_BENCH_STAGES:-1 2 3 4 5 6} ;;
  bench-*) st=${s#bench-}; step "bench$st" record_stages "${FA_BENCH_BUDGET:-540}" ${st//-/ } ;;
  gap) step gap python3 scripts/launch_gap.py --shapes latency throughput long --record ;;
  tiles) step tiles python3 scripts/tile_sweep.py --record ;;
  schedules) step schedules python3 scripts/stage6_schedules.py --record ;;
  ideas5) step ideas5 python3 scripts/stage5_ideas.py --record ;;
  shapemap) step shapemap python3 scripts/shape_map.py --record --resume --dtype bfloat16 ;;
  generate) step generate python3 scripts/generate_record.py --record ;;
  genmodels) step genmodels python3 scripts/generate_record.py --models --record ;;
  hfgpu) step hfgpu python3 -m pytest -p no:cacheprovider -q "${par[@]}" tests/test_hf_variants.py tests/test_hf.py -k "stage6 or generate_matches or tiny_llama" ;;
  hftrain) step hftrain python3 -m pytest -p no:cacheprovider -q "${par[@]}" tests/test_hf_variants.py tests/test_hf.py -k training ;;  # issue 51 item 3
  train) step train python3 scripts/train_curve.py --record ;;
  fp8bench) step fp8bench python3 scripts/fp8_bench.py --record ;;
  fp8tiles) step fp8tiles python3 scripts/fp8_tiles.py --record ;;
  fp8waterfall) step fp8waterfall python3 scripts/fp8_waterfall.py --record ;;
  profile) step profile env OUT="$OUT/session" FA_STEPS=profile bash scripts/gpu_session.sh ;;  # results/profiles/
  notebooks)  # each notebook executed in place (this tree is a copy) and copied out as soon as it is done
    [ -f .nbcache/nbcache.tgz ] && mkdir -p "$FA_CACHE_DIR" && tar xzf .nbcache/nbcache.tgz -C "$FA_CACHE_DIR"  # cubins compiled offline
    mkdir -p "$OUT/nb"
    for nb in ${FA_NOTEBOOKS-notebooks/*.ipynb}; do  # set but empty (--stale named none): none
      step "nb-$(basename "$nb" .ipynb)" python3 -m lib.notebook --execute "$nb"; cp "$nb" "$OUT/nb/"
    done ;;
  *) echo "unknown step $s"; rc=2 ;;
esac; done
# what comes back: the logs and any record this call wrote, in one archive (a call returns at most 8 files;
# a lane's come back in the archive of the call that started it)
[ -n "${FA_LANE:-}" ] && exit $rc
tar czf /tmp/call.tgz -C "$OUT" --exclude call.tgz --exclude gpu-run.tgz . -C "$PWD" $(ls results/*.json) results/profiles 2>/dev/null
mv /tmp/call.tgz "$OUT/"
exit $rc
