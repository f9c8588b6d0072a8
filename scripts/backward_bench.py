"""Time stage 8's backward against SDPA's (its default backend, cuDNN on an H100, and its
FLASH_ATTENTION backend, FlashAttention-2) in interleaved rounds, at the issue's shapes, after
checking stage 8's gradients against float64 autograd (on one batch entry and two heads of each
shape, every sequence length as timed) — and again after timing.

    python scripts/backward_bench.py            # print the table
    python scripts/backward_bench.py --record   # and store it under "backward" in results/<gpu>.json
    python scripts/backward_bench.py --train-step --record   # the training map instead, under "train_step"
    python scripts/backward_bench.py --features --record     # the models' variants, under "backward_variants"
    python scripts/backward_bench.py --head-dims --record    # D96 and D256, under "backward_head_dims"

By default it times bf16 and then fp16 (`--dtype` picks one); `--variants` times the other
builds in the first of them only (`--variants producer`: the producer warpgroup's builds alone,
experiments/backward_producer).

Each side's time is one whole backward: stage 8's preprocess (δ, lse in log2 units), kernel
and postprocess (dQ to q's dtype); SDPA's autograd backward of one forward call (whatever
kernels that backend runs). TFLOPS count 2.5 times the forward's FLOPs (the backward's five
products against the forward's two), as FlashAttention's papers do.

--train-step (issue 48, item 5) times a whole training step through autograd instead: stage 6's
forward and stage 8's backward (`stages.autograd.attention(q, k, v, forward=6, causal=c).backward(dO)`) against SDPA
default's forward and backward, on the shape map's prefill grid (S 512 … 16384 at B·S = 16k
tokens, D 64 with H 16 and D 128 with H 32, MHA and GQA 4:1, full and causal, bf16). Each row's
gradients through that same path are checked against float64 on a slice (one batch entry, one
K/V group) before and after timing. On an H200 the 48 rows took 61 s once the kernels were compiled
(results/logs/2026-11-29-95ec2fa-h200/trainmap.log, three rounds a row then; TRAIN_ROUNDS, TRAIN_BUDGET_S).
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch  # noqa: E402

from lib import results as R  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.notebook_backward import (DETERMINISTIC_LABEL, DK_LAST_LABEL, GUARD_DK_LAST_LABEL, GUARD_LABEL,  # noqa: E402
                                   GUARD_SCALE_LABEL, HEAD_BY_HEAD_LABEL, NO_KV_REGS_LABEL, NO_MASK_SPLIT_LABEL,
                                   NO_PREP_EARLY_LABEL, NO_STMATRIX_LABEL)
from lib.reference import attention_flops, check_gradients, visible_scores  # noqa: E402
from lib.simulator import HAS_GPU  # noqa: E402
from lib.timing import sdpa_backward_call, sdpa_call, time_interleaved  # noqa: E402
from stages import autograd, stage5, stage6, stage8  # noqa: E402

# (B, H, S, D): the anchors' shapes (shared/anchors/h100_backward_fp8.json)
SHAPES = [(16, 16, 2048, 64), (4, 16, 8192, 128)]
BACKENDS = {"SDPA default": "default", "SDPA FLASH": "flash"}  # lib.timing.SDPA_BACKENDS' names


def forward_with_lse(q, k, v, causal, forward=stage5):
    """The forward's output and its log-sum-exp: stage 5's, or (forward=stage6) stage 6's, which
    has head dims 96 and 256."""
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    return forward.attention(q, k, v, causal=causal, lse=lse), lse


def check(B, H, S, D, causal, dtype, seed, forward=stage5, **build) -> dict:
    """Stage 8's gradients (the build of `build`'s switches; default the stage's) on a slice of the
    shape (B1 H2, the same lengths) by the error rule: {dq, dk, dv: the check}
    (lib.reference.check_gradients)."""
    q, k, v = make_qkv(1, 2, S, D, dtype=dtype, seed=seed)
    dout = torch.randn_like(q)
    out, lse = forward_with_lse(q, k, v, causal, forward)
    grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, **build)
    checks = check_gradients(grads, q, k, v, dout, causal=causal)
    for name, c in checks.items():
        print(f"   check B1 H2 S{S} D{D} {'causal' if causal else 'full'} {name}: {c.summary()}", flush=True)
    return checks


def time_builds(q, k, v, out, dout, lse, causal, builds: dict, rounds: int = 7, budget_s: float = 2.0) -> dict:
    """{name: lib.timing.InterleavedTiming} of stage 8's backward as each of `builds` ({name:
    switches}) makes it, and of SDPA's default backward ("SDPA default"), in the same interleaved
    rounds on the same tensors: an experiment's A/B of a switch (experiments/backward_*)."""
    fns = {name: (lambda kw=kw: stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, **kw))
           for name, kw in builds.items()}
    fns["SDPA default"] = sdpa_backward_call(q, k, v, dout, causal=causal)
    return time_interleaved(fns, rounds=rounds, budget_s=budget_s)


def ab_line(label: str, t: dict, a, b) -> str:
    """One row of such an A/B: builds a's and b's median µs, a's time over b's (above 1: b is the
    faster), SDPA's µs and its time over each build's, and both builds' round medians."""
    x, y, s = t[a].median_us, t[b].median_us, t["SDPA default"].median_us
    return (f"{label:34s} {x:10,.0f} {y:10,.0f} {x / y:6.3f} {s:9,.0f} {s / x:8.3f} {s / y:8.3f}  "
            f"{[round(r) for r in t[a].round_medians_us]} | {[round(r) for r in t[b].round_medians_us]}")


def ab_rows(rows, builds_of, rounds: int = 7, exact=lambda D: True) -> bool:
    """An experiment's A/B over rows (B, H, S, D, causal[, dtype]; bf16 unless named; stage 6's forward): each row's builds
    (builds_of(D): {name: switches}, the first the baseline) checked against float64 on a slice before
    and after timing, their dK and dV compared bit for bit with the baseline's (for switches that
    change no sum's order; exact(D) False: dV only, None: neither), and timed in the same rounds with SDPA's default
    backward; one ab_line per other build. Returns whether every check passed."""
    ok = True
    print(f"{'row (bf16 unless fp16): other build':34s} {'base':>10s} {'other':>10s} {'b/o':>6s} {'SDPA':>9s} "
          f"{'S/b':>8s} {'S/o':>8s}  rounds (base | other)", flush=True)
    for B, H, S, D, causal, *rest in rows:
        dtype = rest[0] if rest else torch.bfloat16
        builds = builds_of(D)
        base = next(iter(builds))
        seed = torch.randint(0, 2**31 - 1, ()).item()

        def passes(seed):  # every build's gradients on a slice (check), before and after timing
            return all(c.passed for kw in builds.values()
                       for c in check(B, H, S, D, causal, dtype, seed, stage6, **kw).values())
        ok &= passes(seed)
        q, k, v = make_qkv(B, H, S, D, dtype=dtype, seed=seed)
        dout = torch.randn_like(q)
        out, lse = forward_with_lse(q, k, v, causal, stage6)
        g = {name: stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, **kw) for name, kw in builds.items()}
        same = all(torch.equal(g[base][i], x[i]) for x in g.values()
                   for i in ((1, 2) if exact(D) else () if exact(D) is None else (2,)))
        ok &= same
        t = time_builds(q, k, v, out, dout, lse, causal, builds, rounds=rounds)
        for name in list(builds)[1:]:
            print(ab_line(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}{' fp16' if dtype == torch.float16 else ''}: "
                          f"{name}", t, base, name)
                  + ("" if same else "  dK/dV DIFFER"), flush=True)
        del q, k, v, dout, out, lse, g
        ok &= passes(seed + 1)
    print(("gradients pass" if exact(rows[0][3]) is None else
           "gradients pass, dK and dV bit-equal (dV alone where the builds round dK apart)") if ok
          else "A CHECK FAILED", flush=True)
    return ok


def ab_probe(doc: str, rows, builds_of, exact=lambda D: True) -> int:
    """An experiment probe's main (experiments/backward_*/probe.py): --rounds (default 9), exit 2
    off an H100/H200, else ab_rows(rows, builds_of, exact=exact) and 0 when every check passed."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: times stage 8's Hopper build (sm_90a), so it needs an H100 or H200 and none was found\n")
    return 0 if ab_rows(rows, builds_of, a.rounds, exact) else 1


# The WGMMA build's combinations that --variants times: (label, switches). Warpgroups × how dQ
# is summed × how Q and dO are loaded, then the stage's build with its overlap switch flipped.
_DQ = {(0, 0): "dQ pass", (1, 0): "dQ by red", (1, 1): "dQ by bulk reduction"}
WGMMA_PATH = {  # the switches turned one at a time from the first build to the one before the producer's (PRODUCER_PATH)
    64: [(1, 0, 0, 0), (1, 1, 0, 0), (1, 1, 1, 0), (1, 1, 1, 1), (1, 1, 1, 1, 0)],
    128: [(1, 0, 0, 0), (2, 0, 0, 0), (2, 1, 0, 0), (2, 1, 1, 0), (2, 1, 1, 1)],
}


def wgmma_label(w: int, a: int, b: int, t: int, overlap: int = 1) -> str:
    return (f"WGMMA {w} warpgroup{'s' if w > 1 else ''}, {_DQ[a, b]}{', TMA loads' if t else ''}"
            f"{'' if overlap else ', without overlap'}")


def variants(D, which="all"):
    """(label, keyword arguments) of builds to time beside the stage's own: every combination of
    the WGMMA build's warpgroups, dQ and load switches (the stage's own included, so that every
    shape has the same columns), two warpgroups taking turns at dQ (D 64), the stage's build
    with the overlap switch flipped (at D 64, whose build has none, the combinations above have it;
    there also three blocks per SM) and with its dQ product issued early (DQ_EARLY); the producer
    warpgroup's builds (producer_variants; which="producer": those alone); and (which="all") every tile choice of the mma.sync build, with dQ by
    atomics and by its own pass."""
    out = []
    build = stage8.BEFORE_PRODUCER[D]  # the comparisons below are the build before the producer's
    as_built = {"wgmma": 1, **{name.lower(): value for name, value in build.items()}}
    if stage8.wgmma_here() and which != "producer":
        # every switch these combinations do not name as in that build (the later ones off)
        out += [(wgmma_label(w, a, b, t), {**as_built, "warpgroups": w, "dq_atomics": a, "dq_bulk": b,
                                            "tma_loads": t, "overlap": 1, "dq_turns": 0, "producer": 0})
                for t in stage8.SWITCHES["TMA_LOADS"] for w in stage8.SWITCHES["WARPGROUPS"] for a, b in _DQ]
        if D == 64:  # two warpgroups taking turns at dQ over all 128 keys (DQ_TURNS)
            out.append((wgmma_label(2, 1, 1, 1) + ", dQ in turns",
                        {**as_built, "warpgroups": 2, "dq_atomics": 1, "dq_bulk": 1, "tma_loads": 1, "dq_turns": 1,
                         "producer": 0}))
        without_overlap = wgmma_label(build["WARPGROUPS"], build["DQ_ATOMICS"], build["DQ_BULK"], build["TMA_LOADS"], 0)
        if build["OVERLAP"]:
            out.append(("WGMMA without overlap", {**as_built, "overlap": 0}))
        else:  # the stage's build, the path's last step; the combinations above hold it with the overlap
            out.append((without_overlap, as_built))
        if D == 64:  # three blocks per SM, which fit only without the overlap
            out.append((without_overlap + ", 3 blocks per SM", {**as_built, "overlap": 0, "blocks_per_sm": 3}))
        out.append(("WGMMA, dQ issued before dV and dK are done", {**as_built, "dq_early": 1}))
    if stage8.wgmma_here():
        out += producer_variants(D) + [("WGMMA, the stage's build again", {"wgmma": 1}),
                                       (DETERMINISTIC_LABEL, {"wgmma": 1, "deterministic": True})]
    if which in ("wgmma", "producer"):
        return out
    return out + [(f"mma.sync {tiles} {'dQ atomics' if atomics else 'dQ pass'}",
                   {"tiles": tiles, "dq_atomics": atomics, "wgmma": 0})
                  for tiles in stage8.CHOICES for atomics in stage8.SWITCHES["DQ_ATOMICS"]]


def producer_variants(D):
    """The stage's build with a producer warpgroup (PRODUCER: loads and dQ's bulk reductions
    issued by a warpgroup of their own, setmaxnreg) and, at D 64, with two warpgroups that
    multiply, which the producer's registers make room for (alone, and taking turns at dQ); then
    the stage's build with every switch after the guard off (DK_LAST, MASK_SPLIT, SCALE_AT_END,
    EPILOGUE_SMEM, LONGEST_FIRST, DS_STMATRIX, PREP_EARLY: a step of the waterfall; the next step adds
    SCALE_AT_END, at D 128 the one after it DK_LAST), with DK_LAST flipped where it is off (D 64), without
    MASK_SPLIT and LONGEST_FIRST, head by head (LONGEST_FIRST off), without DS_STMATRIX, PREP_EARLY and
    KV_REGS, at D 128 without PREP_EARLY, at D 64 without KV_REGS and PREP_EARLY 3 (the waterfall's last
    steps before the stage's build)."""
    before = {"wgmma": 1, **{name.lower(): value for name, value in stage8.BEFORE_PRODUCER[D].items()}}
    out = [("WGMMA, producer warpgroup", {**before, "producer": 1})]
    if D == 64:
        out += [("WGMMA 2 warpgroups, producer warpgroup", {**before, "producer": 1, "warpgroups": 2}),
                ("WGMMA 2 warpgroups, producer warpgroup, dQ in turns",
                 {**before, "producer": 1, "warpgroups": 2, "dq_turns": 1})]
    latest = {"ds_stmatrix": 0, "prep_early": 0, "kv_regs": 0}  # the switches after LONGEST_FIRST, off until their steps
    after_guard = {"dk_last": 0, "mask_split": 0, "scale_at_end": 0, "epilogue_smem": 0, "longest_first": 0, **latest}
    out.append((GUARD_LABEL, {"wgmma": 1, **after_guard}))
    out.append((GUARD_SCALE_LABEL, {"wgmma": 1, **after_guard, "scale_at_end": 1}))  # the waterfall's next steps
    if stage8.WGMMA_BUILD[D]["DK_LAST"]:
        out.append((GUARD_DK_LAST_LABEL, {"wgmma": 1, **after_guard, "scale_at_end": 1, "dk_last": 1}))
    else:
        out.append((DK_LAST_LABEL, {"wgmma": 1, "dk_last": 1}))
    out.append((NO_MASK_SPLIT_LABEL, {"wgmma": 1, "mask_split": 0, "longest_first": 0, **latest}))
    out.append((HEAD_BY_HEAD_LABEL, {"wgmma": 1, "longest_first": 0, **latest}))
    out.append((NO_STMATRIX_LABEL, {"wgmma": 1, **latest}))
    if stage8.WGMMA_BUILD[D]["KV_REGS"]:  # D 64: KV_REGS with PREP_EARLY 3, one step (neither won alone)
        out.append((NO_KV_REGS_LABEL, {"wgmma": 1, "kv_regs": 0, "prep_early": 0}))
    elif stage8.WGMMA_BUILD[D]["PREP_EARLY"]:
        out.append((NO_PREP_EARLY_LABEL, {"wgmma": 1, "prep_early": 0}))
    return out


# The waterfall's last steps, after WGMMA_PATH's: the producer warpgroup, then at D 64 the two
# warpgroups its registers make room for, taking turns at dQ; then the dSᵀ store's guard (DS_GUARD);
# the scale at the end (SCALE_AT_END); at D 128 dK's product last (DK_LAST); then (the stage's build
# without the mask split) dK and dV through shared memory (EPILOGUE_SMEM); then MASK_SPLIT (the stage's
# build head by head); then LONGEST_FIRST where the call's rule keeps it (stage8.longest_first: causal
# rows only); then DS_STMATRIX; last at D 64 KV_REGS with PREP_EARLY 3, at D 128 PREP_EARLY 1
PRODUCER_PATH = {64: ["WGMMA, producer warpgroup", "WGMMA 2 warpgroups, producer warpgroup, dQ in turns",
                      GUARD_LABEL, GUARD_SCALE_LABEL, NO_MASK_SPLIT_LABEL, HEAD_BY_HEAD_LABEL, NO_STMATRIX_LABEL,
                      NO_KV_REGS_LABEL, "WGMMA, the stage's build again"],
                 128: ["WGMMA, producer warpgroup", GUARD_LABEL, GUARD_SCALE_LABEL, GUARD_DK_LAST_LABEL,
                       NO_MASK_SPLIT_LABEL, HEAD_BY_HEAD_LABEL, NO_STMATRIX_LABEL, NO_PREP_EARLY_LABEL,
                       "WGMMA, the stage's build again"]}


# --train-step: the training map -----------------------------------------------------------------
TRAIN_HEADS = {64: 16, 128: 32}  # query heads per head dim: the shape map's prefill rows (PREFILL_HEADS)
TRAIN_GROUP = 4                  # GQA 4:1
# per row and side: seven rounds, so that three slow ones do not set the median (experiments/train_step_rounds:
# two slow rounds of three set it; at e1b1d61 three of five did, B32 S512 D64 full, results/logs/2026-11-30-e1b1d61-h200)
TRAIN_ROUNDS, TRAIN_BUDGET_S = 7, 0.3
TRAIN_MIN_RUNS, TRAIN_MAX_RUNS = 10, 60  # at least two runs a round at S 16384 D 128 (~30 ms a step)
STAGE_STEP, SDPA_STEP = "stage 6 + 8", "SDPA default"
TRAIN_METHOD = ("lib.timing.time_interleaved, hold=False: each run is one forward and backward through "
                "autograd (gradients set to None before it), L2 flushed before it, CUDA events around it; "
                "the GPU is not held until the host has queued the step, so host time the GPU waits for "
                "is counted, as a training loop sees it")


def train_shapes(dtype: str = "bfloat16") -> list[dict]:
    """The training map's rows before measuring, as the shape map's prefill grid: per head dim
    (TRAIN_HEADS), S over R.SWEEP_SEQS with B·S = R.SWEEP_TOKENS, MHA and GQA 4:1, full and causal."""
    return [{"B": R.SWEEP_TOKENS // S, "H": H, "Hkv": Hkv, "S": S, "D": D, "causal": causal, "dtype": dtype}
            for D, H in TRAIN_HEADS.items() for S in R.SWEEP_SEQS
            for Hkv in (H, H // TRAIN_GROUP) for causal in (False, True)]


def check_heads(H: int, Hkv: int) -> tuple[int, int]:
    """The heads (query, K/V) of the slice the float64 check runs on: two heads for MHA, as check()
    takes; for GQA one whole group, so that dK and dV sum over every query head sharing a K/V head."""
    return (2, 2) if H == Hkv else (H // Hkv, 1)


def leaves(*tensors) -> list:
    return [t.detach().clone().requires_grad_(True) for t in tensors]


def train_step_call(forward, inputs: list, dout):
    """A zero-argument callable: one training step of attention, forward() (on `inputs`, leaves that
    require grad) then .backward(dout); the gradients are set to None first, as an optimizer's
    zero_grad(set_to_none=True) does, so no step adds into the last one's."""
    def step():
        for t in inputs:
            t.grad = None
        forward().backward(dout)
    return step


def check_train_step(H, Hkv, S, D, causal, dtype, seed) -> dict:
    """Stage 6 + 8's gradients through autograd (the timed path) on a slice of the shape (B1,
    check_heads, the same lengths) by the error rule: {dq, dk, dv: the check}."""
    h, hkv = check_heads(H, Hkv)
    q, k, v = make_qkv(1, h, S, D, Hkv=hkv, dtype=dtype, seed=seed)
    dout = torch.randn_like(q)
    x = leaves(q, k, v)
    autograd.attention(*x, forward=6, causal=causal).backward(dout)
    return check_gradients([t.grad for t in x], q, k, v, dout, causal=causal)


def train_row(shape: dict, stage_t, sdpa_t, before: dict, after: dict) -> dict:
    """One row of the map from the two sides' timings (lib.timing.InterleavedTiming; sdpa_t None
    when SDPA could not run) and the gradient checks before and after timing."""
    B, H, S, D = (shape[x] for x in ("B", "H", "S", "D"))
    flops = 3.5 * attention_flops(B, H, S, S, D, shape["causal"])  # forward's 2 products + backward's 5
    us, sdpa_us = stage_t.median_us, (sdpa_t.median_us if sdpa_t else None)
    return {**shape, "us": us, "sdpa_us": sdpa_us, "vs_sdpa": sdpa_us / us if sdpa_us else None,
            "tflops": flops / us / 1e6, "round_medians_us": stage_t.round_medians_us,
            "sdpa_round_medians_us": sdpa_t.round_medians_us if sdpa_t else None,
            "max_grad_err": {n: max(before[n].max_abs_err, after[n].max_abs_err) for n in before},
            "grad_tolerance": {n: min(before[n].tolerance, after[n].tolerance) for n in before},
            "passed": all(c.passed for c in (*before.values(), *after.values()))}


def measure_train_row(shape: dict) -> dict:
    """Check, time both sides' steps on the same inputs in interleaved rounds, check again."""
    B, H, Hkv, S, D, causal = (shape[x] for x in ("B", "H", "Hkv", "S", "D", "causal"))
    dtype = getattr(torch, shape["dtype"])
    seed = torch.randint(0, 2**31 - 1, ()).item()
    before = check_train_step(H, Hkv, S, D, causal, dtype, seed)
    q, k, v = make_qkv(B, H, S, D, Hkv=Hkv, dtype=dtype)
    dout = torch.randn_like(q)
    ours, theirs = leaves(q, k, v), leaves(q, k, v)
    sdpa_forward = sdpa_call(*theirs, causal=causal)  # enable_gqa where Hkv < H
    fns = {STAGE_STEP: train_step_call(lambda: autograd.attention(*ours, forward=6, causal=causal), ours, dout),
           SDPA_STEP: sdpa_forward and train_step_call(sdpa_forward, theirs, dout)}
    # hold=False: see TRAIN_METHOD (at S 512 and 1024 the host's launches are what is measured)
    t = time_interleaved(fns, rounds=TRAIN_ROUNDS, budget_s=TRAIN_BUDGET_S, min_runs=TRAIN_MIN_RUNS,
                         max_runs=TRAIN_MAX_RUNS, hold=False)
    del q, k, v, dout, ours, theirs, fns
    after = check_train_step(H, Hkv, S, D, causal, dtype, seed + 1)  # validated again after timing
    return train_row(shape, t[STAGE_STEP], t.get(SDPA_STEP), before, after)


def train_row_line(r: dict) -> str:
    worst = max(r["max_grad_err"][n] / r["grad_tolerance"][n] for n in r["max_grad_err"])
    vs = f"{r['vs_sdpa']:.2f}x SDPA's speed" if r.get("vs_sdpa") else "SDPA did not run"
    return (f"{r['dtype']} B{r['B']} H{r['H']}/{r['Hkv']} S{r['S']} D{r['D']} {'causal' if r['causal'] else 'full  '}: "
            f"step {r['us']:9,.1f} µs, SDPA default's {r['sdpa_us'] or 0:9,.1f} µs ({vs}); gradients "
            f"{'pass' if r['passed'] else 'FAIL'} (largest error / tolerance {worst:.2f})")


def train_map(record: bool) -> int:
    """The --train-step part: every row of train_shapes measured, printed, and with `record`
    stored under "train_step" when every gradient check passed."""
    if torch.cuda.get_device_capability() != (9, 0):
        print("--train-step times stage 6's forward, which runs on sm_90 GPUs (H100/H200) only: "
              "skipped, nothing measured", file=sys.stderr)
        return 0
    shapes, rows, t0 = train_shapes(), [], time.time()
    for i, shape in enumerate(shapes):
        rows.append(measure_train_row(shape))
        print(f"[{i + 1}/{len(shapes)}, {time.time() - t0:.0f} s] {train_row_line(rows[-1])}", flush=True)
    got = [r["vs_sdpa"] for r in rows if r.get("vs_sdpa")]
    if got:
        print(f"training step, stage 6 + 8 / SDPA default: {min(got):.2f}x to {max(got):.2f}x over {len(got)} "
              f"rows, at or above 1 in {sum(x >= 1 for x in got)} [{time.time() - t0:.0f} s]", flush=True)
    if not all(r["passed"] for r in rows):
        print("a gradient check failed: nothing recorded" if record else "a gradient check failed", file=sys.stderr)
        return 1
    if record:
        env = R.capture_env()
        shas = {str(n): R.stage_sha256(m.INFO) for n, m in ((6, stage6), (8, stage8))}
        path = R.save_extra(env["gpu"], "train_step", {"env": env, "sha256": shas, "method": TRAIN_METHOD,
                                                       "rows": rows})
        print(f"recorded in {path}")
    return 0


# --features: what the models' variants cost in stage 8's backward (issue 51) ----------------------
FEATURE_SHAPES = [(16, 16, 2048, 64), (4, 16, 8192, 128)]  # SHAPES, bf16
WINDOW_SHAPES, WINDOW = [(1, 16, 32768, 64), (1, 16, 32768, 128)], 4096
SOFTCAP, SINK_SPREAD = 30.0, 2.0  # as scripts/stage6_schedules.py --features


def feature_calls(S: int, H: int, device) -> dict:
    """{label: variant keywords}: the plain build, then each variant (and all three) alone; the
    window wider than the sequence, so that only the switch's cost shows."""
    sinks = (torch.randn(H, device=device) * SINK_SPREAD).float()
    return {"none": {}, "softcap (tanh.approx)": {"softcap": SOFTCAP, "softcap_tanh": "approx"},
            "softcap (tanh from ex2)": {"softcap": SOFTCAP, "softcap_tanh": "exp2"},
            "window (wider than the sequence)": {"window": (S, S)}, "sinks": {"sinks": sinks},
            "all three": {"softcap": SOFTCAP, "window": (S, S), "sinks": sinks}}


def variant_backward(q, k, v, dout, causal, kw):
    """Stage 6's forward with the variants (its lse saved), then a zero-argument call of stage 8's
    backward with the same ones, and that backward's gradients."""
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    out = stage6.attention(q, k, v, causal=causal, lse=lse, **kw)
    call = lambda: stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, **kw)  # noqa: E731
    return call, call()


def check_variant(D: int, causal, kw: dict) -> bool:
    """One odd shape (GQA, Sq != Sk, no multiple of a tile) against float64 autograd of the same
    definition (check_gradients, told when the softcap's tanh is tanh.approx)."""
    from stages.stage6_variants import softcap_build
    q, k, v = make_qkv(1, 4, 300, D, Sk=517, Hkv=2, dtype=torch.bfloat16)
    dout = torch.randn_like(q)
    kw = dict(kw)
    if "window" in kw:
        kw["window"] = (517, 517) if kw["window"][1] > 0 else (97, 0)
    if "sinks" in kw:
        kw["sinks"] = torch.randn(4, device=q.device).float()
    _, grads = variant_backward(q, k, v, dout, "bottom_right" if causal else False, kw)
    approx = "softcap" in kw and softcap_build(q.dtype, kw.get("softcap_tanh")) == 1
    ref_kw = {x: kw[x] for x in ("window", "softcap", "sinks") if x in kw}
    checks = check_gradients(grads, q, k, v, dout, causal="bottom_right" if causal else False,
                             approx_tanh=approx, **ref_kw)
    return all(c.passed for c in checks.values())


def backward_features(a) -> int:
    """--features: each variant's backward against the plain build's at the standard shapes, and a
    4096-key window's backward against causal's per computed score at S 32768; recorded under
    "backward_variants". Forward not timed: each backward reads the same forward's out and lse."""
    rows, ok, t0 = [], True, time.time()
    for B, H, S, D in FEATURE_SHAPES:
        q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
        dout = torch.randn_like(q)
        for causal in (False, True):
            calls = feature_calls(S, H, q.device)
            passed = {lab: check_variant(D, causal, kw) for lab, kw in calls.items()}
            fns = {lab: variant_backward(q, k, v, dout, causal, kw)[0] for lab, kw in calls.items()}
            t = time_interleaved(fns, rounds=a.rounds, budget_s=0.5)
            base = t["none"]
            print(f"backward B{B} H{H} S{S} D{D} bf16 {'causal' if causal else 'full'}: plain build "
                  f"{base.median_us:,.1f} µs ({time.time() - t0:.0f} s)", flush=True)
            for lab in calls:
                rows.append({"kind": "switch", "variant": lab, "B": B, "H": H, "S": S, "D": D, "causal": causal,
                             "dtype": "bfloat16", "us": t[lab].median_us, "us_rounds": t[lab].round_medians_us,
                             "base_us": base.median_us, "base_us_rounds": base.round_medians_us,
                             "passed": passed[lab]})
                ok &= passed[lab]
                print(f"  {lab:34s} {t[lab].median_us:10,.1f} µs  {t[lab].median_us / base.median_us:5.3f}x "
                      f"the plain build  {'pass' if passed[lab] else 'FAIL'}", flush=True)
            del fns
        del q, k, v, dout
    for B, H, S, D in WINDOW_SHAPES:
        q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
        dout = torch.randn_like(q)
        passed = check_variant(D, True, {"window": (WINDOW, 0)}) and check_variant(D, True, {})
        fns = {"causal": variant_backward(q, k, v, dout, True, {})[0],
               f"causal, window {WINDOW}": variant_backward(q, k, v, dout, True, {"window": (WINDOW, 0)})[0]}
        t = time_interleaved(fns, rounds=a.rounds, budget_s=1.0)
        full, win = visible_scores(S, S), visible_scores(S, WINDOW)
        tc, tw = t["causal"].median_us, t[f"causal, window {WINDOW}"].median_us
        for lab in fns:
            rows.append({"kind": "window", "variant": lab, "B": B, "H": H, "S": S, "D": D, "causal": True,
                         "dtype": "bfloat16", "us": t[lab].median_us, "us_rounds": t[lab].round_medians_us,
                         "window": [WINDOW, 0] if "window" in lab else None,
                         "scores_per_head": win if "window" in lab else full, "causal_us": tc, "passed": passed})
        ok &= passed
        print(f"backward window B{B} H{H} S{S} D{D}: causal {tc:,.1f} µs, window {WINDOW} {tw:,.1f} µs: "
              f"{(win / tw) / (full / tc):.3f}x causal's scores per µs {'pass' if passed else 'FAIL'} "
              f"({time.time() - t0:.0f} s)", flush=True)
        del q, k, v, dout, fns
    if a.record and ok:
        env = R.capture_env()
        path = R.save_extra(env["gpu"], "backward_variants", {"env": env, "sha256": R.stage_sha256(stage8.INFO),
                                                              "softcap": SOFTCAP, "window": WINDOW, "rows": rows})
        print(f"recorded in {path}")
    elif a.record:
        print("not recorded: a gradient check failed", file=sys.stderr)
    return 0 if ok else 1


# (B, H, S, D) of --head-dims: D 256 long and short (Gemma 2's head dim); D 96 (Phi-3's) and D 128 at
# the same shape, so that what D 96's padding costs reads off beside D 128. Stage 6's forward, bf16.
HEAD_DIM_SHAPES = [(2, 16, 4096, 256), (8, 16, 1024, 256), (4, 16, 4096, 96), (4, 16, 4096, 128)]
# the builds timed beside the stage's at D 256: the switch its rule turned off
HEAD_DIM_BUILDS = {256: {"with OVERLAP": {"overlap": 1}}}


def head_dims(a) -> int:
    """--head-dims: stage 8 at D 96 and D 256 (and D 128 at D 96's shape) against SDPA's backward
    (default and FLASH), the gradients of every timed build checked against float64 on a slice
    first; recorded under "backward_head_dims"."""
    rows, ok, t0 = [], True, time.time()
    for B, H, S, D in HEAD_DIM_SHAPES:
        for causal in (False, True):
            seed = torch.randint(0, 2**31 - 1, ()).item()
            q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16, seed=seed)
            dout = torch.randn_like(q)
            out, lse = forward_with_lse(q, k, v, causal, stage6)
            builds = {"stage 8": {}, **HEAD_DIM_BUILDS.get(D, {})}
            passed = {label: all(c.passed for c in check(B, H, S, D, causal, torch.bfloat16, seed, stage6, **kw).values())
                      for label, kw in builds.items()}
            ok &= all(passed.values())
            fns = {label: (lambda kw=kw: stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, **kw))
                   for label, kw in builds.items()}
            fns.update({name: sdpa_backward_call(q, k, v, dout, causal=causal, backend=b) for name, b in BACKENDS.items()})
            t = time_interleaved(fns, rounds=a.rounds, budget_s=1.0)
            flops = 2.5 * attention_flops(B, H, S, S, D, causal)
            row = {"B": B, "H": H, "S": S, "D": D, "causal": causal, "dtype": "bfloat16",
                   # D 96 on zero-padded copies in the mma.sync build only (the WGMMA build has it in D 128's tiles)
                   "padded_to": None if stage8.wgmma_here() else stage8.PADDED.get(D),
                   "build": dict(stage8.config(D, wgmma=1)["defines"]),
                   "us": t["stage 8"].median_us, "round_medians_us": t["stage 8"].round_medians_us,
                   "tflops": flops / t["stage 8"].median_us / 1e6, "passed": passed["stage 8"],
                   "others": {label: {"us": t[label].median_us, "round_medians_us": t[label].round_medians_us,
                                      "passed": passed[label]} for label in builds if label != "stage 8"}}
            for name, key in (("SDPA default", "sdpa_us"), ("SDPA FLASH", "sdpa_flash_us")):
                row[key] = t[name].median_us if name in t else None
            rows.append(row)
            sd, fl = row["sdpa_us"], row["sdpa_flash_us"]
            print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full':6s}: stage 8 {row['us']:9,.1f} µs "
                  f"({row['tflops']:5.1f} TFLOPS, {'pass' if passed['stage 8'] else 'FAIL'}); SDPA default "
                  f"{sd or 0:9,.1f} µs ({(sd or 0) / row['us']:.3f}x), FLASH {fl or 0:9,.1f} µs "
                  f"({(fl or 0) / row['us']:.3f}x)" + "".join(f"; {lab} {o['us']:,.1f} µs ({o['us'] / row['us']:.3f}x "
                                                              f"the stage's time)" for lab, o in row["others"].items())
                  + f" ({time.time() - t0:.0f} s)", flush=True)
            del q, k, v, dout, out, lse, fns
            torch.cuda.empty_cache()
    if a.record and ok:
        env = R.capture_env()
        shas = {str(n): R.stage_sha256(m.INFO) for n, m in ((6, stage6), (8, stage8))}
        path = R.save_extra(env["gpu"], "backward_head_dims", {"env": env, "sha256": shas, "rows": rows})
        print(f"recorded in {path}")
    elif a.record:
        print("not recorded: a gradient check failed", file=sys.stderr)
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", action="store_true",
                    help="store the rows under 'backward' (with --train-step: 'train_step') in results/<gpu>.json")
    ap.add_argument("--train-step", action="store_true",
                    help="time the training map (whole steps through autograd against SDPA's) instead of the "
                         "backward table; needs an sm_90 GPU (61 s on an H200 once compiled)")
    ap.add_argument("--features", action="store_true",
                    help="time the models' variants in the backward instead (window, softcap, sinks: "
                         "each against the plain build, and a 4096-key window against causal per score); "
                         "needs an sm_90 GPU")
    ap.add_argument("--head-dims", action="store_true",
                    help="time D 96 and D 256 (and D 128 at D 96's shape) against SDPA's backward instead, "
                         "under 'backward_head_dims'; needs an sm_90 GPU")
    ap.add_argument("--dtype", default="both", choices=["float16", "bfloat16", "both"],
                    help="both (the default, what the record holds): bf16 rows, then fp16 rows; the "
                         "variants are timed in the first dtype only")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", nargs="?", const="all", choices=["all", "wgmma", "producer"],
                    help="also time the other builds: every switch of the WGMMA build and (all, the "
                         "default) every tile choice and dQ switch of the mma.sync build (stage8.CHOICES, SWITCHES); "
                         "producer: only the producer warpgroup's builds (PRODUCER)")
    a = ap.parse_args()
    if not HAS_GPU:
        ap.exit(2, f"{ap.prog}: times kernels, so it needs a CUDA GPU and none was found\n")
    if a.train_step:
        return train_map(a.record)
    if a.features:
        return backward_features(a)
    if a.head_dims:
        return head_dims(a)
    dtypes = ["bfloat16", "float16"] if a.dtype == "both" else [a.dtype]
    rows, ok = [], True
    for dtype_name, B, H, S, D, causal in ((t, *shape, c) for t in dtypes for shape in SHAPES for c in (False, True)):
        dtype = getattr(torch, dtype_name)
        timed_variants = variants(D, a.variants) if a.variants and dtype_name == dtypes[0] else []
        t0 = time.time()
        seed = torch.randint(0, 2**31 - 1, ()).item()
        before = check(B, H, S, D, causal, dtype, seed)
        q, k, v = make_qkv(B, H, S, D, dtype=dtype, seed=seed)
        dout = torch.randn_like(q)
        out, lse = forward_with_lse(q, k, v, causal)
        fns = {"stage 8": lambda: stage8.attention_backward(q, k, v, out, dout, lse, causal=causal)}
        for label, kw in timed_variants:
            fns[label] = (lambda kw=kw: stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, **kw))
        fns.update({name: sdpa_backward_call(q, k, v, dout, causal=causal, backend=b)
                    for name, b in BACKENDS.items()})
        t = time_interleaved(fns, rounds=a.rounds, budget_s=2.0)
        flops = 2.5 * attention_flops(B, H, S, S, D, causal)
        build = dict(stage8.config(D, wgmma=1)["defines"]) if stage8.wgmma_here() else {"WGMMA": 0}
        row = {"stage": 8, "B": B, "H": H, "S": S, "D": D, "causal": causal, "dtype": dtype_name, "build": build,
               "us": t["stage 8"].median_us, "tflops": flops / t["stage 8"].median_us / 1e6,
               "round_medians_us": t["stage 8"].round_medians_us,
               "variants": {label: {"us": t[label].median_us, "round_medians_us": t[label].round_medians_us}
                            for label, _ in timed_variants}}
        for label, v_ in row["variants"].items():
            print(f"   {label:34s} {v_['us']:10,.1f} µs ({t['stage 8'].median_us / v_['us']:.2f}x the stage's build)")
        for name in BACKENDS:
            if name in t:
                key = name.split()[1].lower()
                row[f"sdpa_{key}_us"] = t[name].median_us
                row[f"sdpa_{key}_round_medians_us"] = t[name].round_medians_us
        rows.append(row)
        print(f"{dtype_name} B{B} H{H} S{S} D{D} {'causal' if causal else 'full  '}: stage 8 {row['us']:9,.1f} µs "
              f"({row['tflops']:5.1f} TFLOPS); SDPA default {row.get('sdpa_default_us', 0):9,.1f} µs "
              f"(stage 8 {row.get('sdpa_default_us', 0) / row['us']:.2f}x its speed); FLASH "
              f"{row.get('sdpa_flash_us', 0):9,.1f} µs ({row.get('sdpa_flash_us', 0) / row['us']:.2f}x) "
              f"[{time.time() - t0:.0f} s]", flush=True)
        del q, k, v, dout, out, lse, fns
        after = check(B, H, S, D, causal, dtype, seed + 1)  # validated again after timing
        # the larger error of the two checks per gradient, with its tolerance, and whether both held
        row["max_grad_err"] = {n: max(before[n].max_abs_err, after[n].max_abs_err) for n in before}
        row["grad_tolerance"] = {n: min(before[n].tolerance, after[n].tolerance) for n in before}
        row["passed"] = all(c.passed for c in (*before.values(), *after.values()))
        row["sdpa_us"] = row.get("sdpa_default_us")  # SDPA default's backward, the name for it
        ok &= row["passed"]
    print("\n| dtype | shape | causal | stage 8 µs | TFLOPS | SDPA default µs | × SDPA default "
          "| SDPA FLASH µs | × SDPA FLASH |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dtype']} | B{r['B']} H{r['H']} S{r['S']} D{r['D']} | {'yes' if r['causal'] else 'no'} "
              f"| {r['us']:,.0f} | "
              f"{r['tflops']:.0f} | {r.get('sdpa_default_us', 0):,.0f} | {r.get('sdpa_default_us', 0) / r['us']:.2f} | "
              f"{r.get('sdpa_flash_us', 0):,.0f} | {r.get('sdpa_flash_us', 0) / r['us']:.2f} |")
    if a.record and not ok:
        print("not recorded: a gradient check failed", file=sys.stderr)
    elif a.record:
        env = R.capture_env()
        shas = {str(n): R.stage_sha256(m.INFO) for n, m in ((5, stage5), (8, stage8))}
        path = R.save_extra(env["gpu"], "backward", {"env": env, "sha256": shas, "rows": rows})
        print(f"recorded in {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
