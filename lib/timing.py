"""Timing on the GPU: CUDA events on the current stream, warm-up after compilation, L2
flushed before every timed run, median of many runs. Also SDPA's backends timed the same way,
and the machine's own ceilings (copy bandwidth, matmul rate) that the roofline uses."""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from lib.reference import attention_flops
from lib.simulator import require_gpu


@dataclass
class Timing:
    median_us: float
    min_us: float
    p20_us: float
    p80_us: float
    runs: int

    def as_dict(self):
        return asdict(self)


_flush_buffer = None


def flush_l2():
    """Write a buffer twice the size of L2, so the next kernel reads its inputs from HBM."""
    global _flush_buffer
    if _flush_buffer is None:
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        _flush_buffer = torch.empty(max(2 * l2, 64 << 20), dtype=torch.uint8, device="cuda")
    _flush_buffer.zero_()


def _timed_runs(fn, runs: int, flush: bool, spin_cycles: int = 0) -> list[float]:
    """Device times (µs) of `runs` calls of fn(), an event pair around each, L2 flushed before
    each when `flush`. With spin_cycles, the GPU spins that long before each start event: the
    host then has queued the call by the time the GPU reaches it, so the pair times the call's
    GPU work only. Without it, a call whose launch costs the host more than the GPU spends on the
    flush is timed with the GPU waiting for that launch between the events (small shapes)."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(runs)]
    for s, e in events:
        if flush:
            flush_l2()
        if spin_cycles:
            torch.cuda._sleep(spin_cycles)
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in events]


def _prepare(fn, *, warmup, min_runs, max_runs, budget_s, flush, hold) -> tuple[int, int, float]:
    """Warm fn() up, and say how many runs fit in budget_s (from one probe run), how long
    the GPU should spin before each (hold: 3x the host time of the fastest warm-up call, at
    least 50 µs, in cycles at 2 GHz; a slower clock spins longer, which is as good) and the
    probe run's seconds."""
    host_s = []
    for _ in range(max(warmup, 1 if hold else 0)):
        t0 = time.perf_counter()
        fn()
        host_s.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    spin = int(2e9 * max(50e-6, 3 * min(host_s))) if hold else 0
    probe_s = _timed_runs(fn, 1, flush, spin)[0] / 1e6
    return int(min(max_runs, max(min_runs, budget_s / max(probe_s, 1e-6)))), spin, probe_s


def _timing(us: list[float], runs: int) -> Timing:
    us = sorted(us)
    q = statistics.quantiles(us, n=5) if len(us) > 1 else [us[0]] * 4
    return Timing(median_us=statistics.median(us), min_us=us[0], p20_us=q[0], p80_us=q[3],
                  runs=runs)


def time_cuda(fn, *, warmup=2, min_runs=5, max_runs=100, budget_s=1.0, flush=True,
              hold=True) -> Timing:
    """Median device time of fn() in microseconds. Runs as many times as fit in budget_s,
    between min_runs and max_runs; the first `warmup` calls (compilation, caches) are not
    counted. hold: the GPU spins before each run until the host has queued it (_timed_runs);
    hold=False times as before 2026-11-23's fix, host launch gaps included."""
    require_gpu("timing")
    runs, spin, _ = _prepare(fn, warmup=warmup, min_runs=min_runs, max_runs=max_runs,
                          budget_s=budget_s, flush=flush, hold=hold)
    return _timing(_timed_runs(fn, runs, flush, spin), runs)


# The H100 runs long shapes at its power limit, and its clocks follow the power drawn over the last
# stretch of time: a batch of runs that follows a callable drawing less power (SDPA's FLASH backend
# at long shapes, twice as slow) starts at higher clocks. Measured on an H100
# (experiments/place_in_round/place_probe.py, results/logs/2026-11-26-c3dea5d-h100): at B2 H32 S8192
# D128 bf16, SDPA default over stage 6 was 1.12-1.19x in the three orders of a round where stage 6
# came right after FLASH and 0.99-1.03x in the three where SDPA did; at B8 H16 S2048 D64 and B16 H32
# S1024 D128 every order agreed within 0.4%. Until then (2026-11-26) every record timed stage 6 right
# after FLASH. So each batch now starts after SETTLE_MS of the callable's own untimed runs: with 50 or 150
# ms the orders no longer sorted by who follows FLASH (results/logs/2026-11-26-5533c7f-h100: 1.02-1.11x
# full and 1.04-1.14x causal in the six orders with 50 ms, 0.99-1.17x and 1.00-1.13x with 150 ms),
# though at that shape separate runs of the same order still differ by up to 5% (stage 6) and 10%
# (SDPA).
SETTLE_MS = 50.0
SETTLE_MAX_RUNS = 30


@dataclass
class InterleavedTiming(Timing):
    round_medians_us: list  # the median of each round, in the order they ran

    @property
    def spread(self) -> float:
        """Slowest round's median over the fastest's: 1.0 when every round agreed."""
        return max(self.round_medians_us) / min(self.round_medians_us)


def settle_runs(probe_s: float, settle_ms: float) -> int:
    """Untimed runs before each batch of time_interleaved: about settle_ms of the call's own
    work, at most SETTLE_MAX_RUNS (a short call draws too little power to matter, and would
    only add host time)."""
    if settle_ms <= 0:
        return 0
    return min(SETTLE_MAX_RUNS, max(1, math.ceil(settle_ms / 1e3 / max(probe_s, 1e-6))))


def time_interleaved(fns: dict, *, rounds=5, warmup=2, min_runs=5, max_runs=100,
                     budget_s=1.0, flush=True, hold=True, settle_ms=None) -> dict:
    """time_cuda for several callables ({name: fn}; None values are left out) whose runs are
    split into `rounds` rounds taken in turn: round 1 of every fn, then round 2, ... A slow
    spell of the GPU (a clock dip, a busy neighbour) that lasts part of the measurement then
    lands in a few rounds of every fn instead of in all the runs of one, and the median over
    all runs of a fn stays put. Each fn gets the runs time_cuda would give it.

    Each batch of runs starts after settle_ms (None: SETTLE_MS) of the same fn's untimed runs
    (settle_runs), so that it is timed at the clocks its own power draw allows, not at those the
    fn before it in the round left behind (see SETTLE_MS); and round r starts at the r-th fn,
    so that no fn always comes after the same neighbour."""
    require_gpu("timing")
    fns = {name: fn for name, fn in fns.items() if fn is not None}
    plan = {name: _prepare(fn, warmup=warmup, min_runs=min_runs, max_runs=max_runs,
                           budget_s=budget_s, flush=flush, hold=hold) for name, fn in fns.items()}
    runs = {name: n for name, (n, _, _) in plan.items()}
    settle = {name: settle_runs(probe_s, SETTLE_MS if settle_ms is None else settle_ms)
              for name, (_, _, probe_s) in plan.items()}
    samples = {name: [] for name in fns}
    medians = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        # each round starts one callable further on, so that none always follows the same one
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = fns[name]
            # an even share of the runs, the remainder in the first rounds
            n = runs[name] // rounds + (1 if r < runs[name] % rounds else 0)
            if n:
                if settle[name]:
                    _timed_runs(fn, settle[name], flush, plan[name][1])  # untimed: see SETTLE_MS
                us = _timed_runs(fn, n, flush, plan[name][1])
                samples[name] += us
                medians[name].append(statistics.median(us))
    return {name: InterleavedTiming(**_timing(samples[name], runs[name]).as_dict(),
                                    round_medians_us=medians[name]) for name in fns}


@dataclass
class HostTiming:
    host_us: float  # wall time per call of `calls` back-to-back calls, synchronized once at the end
    gpu_us: float   # median GPU time of one of the same calls (CUDA events around each)
    calls: int

    def as_dict(self):
        return asdict(self)


def time_host(fn, *, calls=300, warmup=3, gpu_calls=100) -> HostTiming:
    """What a model making many small attention calls waits for: the wall time per call of
    `calls` back-to-back calls of fn() after warm-up, with one synchronization at the end (no
    L2 flush, nothing between the calls). When launching a call costs the host more than the
    GPU spends running it, host_us exceeds gpu_us: the GPU waits for the host.

    gpu_us comes from a second pass (`gpu_calls` of the same calls) with an event pair around
    each. Before each start event the GPU spins for about twice the host time of a call, so
    the call's work is queued by the time the start event runs: the events then time the GPU's
    work, not the host's launching (which would also leave the GPU idle between the events)."""
    require_gpu("host timing")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    host_us = (time.perf_counter() - t0) / calls * 1e6
    spin_cycles = int(2 * host_us * 2e3)  # 2x host_us at 2 GHz; longer on a slower clock
    gpu_us = statistics.median(_timed_runs(fn, gpu_calls, flush=False, spin_cycles=spin_cycles))
    return HostTiming(host_us=host_us, gpu_us=gpu_us, calls=calls)


def tflops(B, H, Sq, Sk, D, causal, us) -> float:
    return attention_flops(B, H, Sq, Sk, D, causal) / (us * 1e-6) / 1e12


SDPA_BACKENDS = {"default": None, "flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}


def sdpa_call(q, k, v, *, causal=False, scale=None, backend="default"):
    """A zero-argument callable running SDPA with one backend forced (or its default choice);
    None when that backend cannot take these inputs (say FLASH with float32). causal as the
    stages take it (lib.reference.sdpa_keywords)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from lib.reference import sdpa_keywords

    name = SDPA_BACKENDS[backend]
    kw = sdpa_keywords(q, k, causal)

    def call():
        if name is None:
            return F.scaled_dot_product_attention(q, k, v, scale=scale, **kw)
        with sdpa_kernel(getattr(SDPBackend, name)):
            return F.scaled_dot_product_attention(q, k, v, scale=scale, **kw)

    try:
        call()
    except RuntimeError:  # "No available kernel" for these inputs
        return None
    return call


def sdpa_backward_call(q, k, v, dout, *, causal=False, backend="default"):
    """A zero-argument callable running SDPA's backward of one forward (run once here, its graph
    kept), with one backend forced for the forward and so for its backward; None when that
    backend cannot take these inputs."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    forward = sdpa_call(*leaves, causal=causal, backend=backend)
    if forward is None:
        return None
    out = forward()
    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)


def time_sdpa(q, k, v, *, causal=False, scale=None, backend="default", **kw):
    fn = sdpa_call(q, k, v, causal=causal, scale=scale, backend=backend)
    return None if fn is None else time_cuda(fn, **kw)
