"""Issue 48, item 3: the latency shape's training step taken apart by wall clock, without a
profiler (cProfile's own cost per Python call is the size of what it measures here).

Each row is the host's wall time per call of back-to-back calls with one synchronization at the
end (the median of 5 repeats of 300 calls), at B1 H8 S512 D64 bf16, where the GPU's work per
step (about 30 µs) is far below the host's. Rows:
  - the forwards with and without a graph, stage 6's and SDPA's;
  - stage 8's backward called directly (no autograd), and its pieces: one launch, one
    allocation, a tensor map's retarget;
  - the autograd engine's cost alone: a step through a Python autograd.Function that launches one
    copy each way, and the same through a C++ node;
  - where the step's time falls: timestamps on the host before the forward, after it, on entry to
    and exit from stage 8's backward (on whichever thread the engine runs it) and after grad().
  - a launch through the driver's cuLaunchKernel by ctypes with the arguments packed once,
    against cuda.core's launch of the same kernel and arguments (a prototype: is the launch path
    what costs?).

    python3 experiments/train_step_host/breakdown.py
"""
import ctypes
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib import nvrtc  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.tma import Address  # noqa: E402
from stages import autograd, stage6, stage8  # noqa: E402

B, H, S, D = 1, 8, 512, 64


def wall(fn, calls=300, repeats=5):
    """Median and least host µs per call of `calls` back-to-back calls, one sync at the end."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    reps = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        reps.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(reps), min(reps)


def row(name, fn, **kw):
    med, low = wall(fn, **kw)
    print(f"{name:58s} {med:8.1f} {low:8.1f}", flush=True)
    return med


class PyFloor(torch.autograd.Function):
    """Three inputs, one output, three gradients allocated, nothing launched: what any backward
    written as a Python autograd.Function costs the host at least."""

    @staticmethod
    def forward(ctx, q, k, v):
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, g):
        return torch.empty_like(g), torch.empty_like(g), torch.empty_like(g)


class PyIdentity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q):
        return q.clone()

    @staticmethod
    def backward(ctx, g):
        return g.clone()


def main():
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, switch interval "
          f"{sys.getswitchinterval() * 1e3:.1f} ms, threads {[t.name for t in threading.enumerate()]}")
    q, k, v = (t.requires_grad_() for t in make_qkv(B, H, S, D, dtype=torch.bfloat16))
    do = torch.randn_like(q)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    train = lambda: autograd.attention(q, k, v, forward=6)  # noqa: E731
    print(f"{'B1 H8 S512 D64 bf16: host µs per call':58s} {'median':>8s} {'least':>8s}")
    row("SDPA step: grad(sdpa(q, k, v))", lambda: torch.autograd.grad(sdpa(q, k, v), (q, k, v), do))
    row("stage 6+8 step: grad(autograd.attention(q, k, v))", lambda: torch.autograd.grad(train(), (q, k, v), do))
    row("SDPA forward, graph kept", lambda: sdpa(q, k, v))
    row("stage 6 forward, graph kept (autograd.attention)", train)
    with torch.no_grad():
        row("SDPA forward, no grad", lambda: sdpa(q, k, v))
        row("stage 6 forward, no grad", lambda: stage6.attention(q, k, v))
        lse = torch.empty((B, H, S), dtype=torch.float32, device=q.device)
        out = stage6.attention(q, k, v, lse=lse)
        row("stage 6 forward with lse=, no grad", lambda: stage6.attention(q, k, v, lse=lse))
        row("stage 8 backward, called directly", lambda: stage8.attention_backward(q, k, v, out, do, lse))
        plan = next(iter(stage8._launches.values()))
        dq = torch.empty((B, H, plan.sq_pad, D), dtype=torch.float32, device=q.device)
        delta, lse2 = torch.empty((2, B, H, plan.sq_pad), dtype=torch.float32, device=q.device)
        pre_args = (do.data_ptr(), out.data_ptr(), lse.data_ptr(), delta.data_ptr(), lse2.data_ptr(),
                    dq.data_ptr() if plan.wgmma_acc else 0, *plan.pre_args)
        row("  one launch (the preprocess, cuda.core)", lambda: nvrtc.launch_prepared(plan.pre, plan.pre_config, pre_args))
        row("  one torch.empty (2, B, H, Sq) float32", lambda: torch.empty((2, B, H, plan.sq_pad), dtype=torch.float32, device=q.device))
        if plan.maps:
            row("  one tensor map retarget", lambda: plan.maps[0].replace_address(Address(q)))
        row("  nvrtc.current_stream()", nvrtc.current_stream)
        ctypes_launch(plan, pre_args, delta)
    x = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    row("engine: grad through a C++ node (clone)", lambda: torch.autograd.grad(x.clone(), (x,), do))
    row("engine: grad through a Python Function (clone each way)", lambda: torch.autograd.grad(PyIdentity.apply(x), (x,), do))
    row("engine: Python Function floor (q, k, v; gradients allocated, no launch)",
        lambda: torch.autograd.grad(PyFloor.apply(q, k, v), (q, k, v), do))
    timeline(q, k, v, do, train)


def timeline(q, k, v, do, train):
    """Where a step's wall time falls: before/after the forward, entry/exit of the backward."""
    stamps, inner = [], stage8._backward

    def timed(*a, **kw):
        t_in = time.perf_counter()
        r = inner(*a, **kw)
        stamps[-1] += [t_in, time.perf_counter(), threading.get_ident()]
        return r

    stage8._backward = timed  # what the Function's backward calls
    try:
        for i in range(320):
            t0 = time.perf_counter()
            stamps.append([t0])
            o = train()
            stamps[-1].append(time.perf_counter())
            torch.autograd.grad(o, (q, k, v), do)
            stamps[-1].insert(2, time.perf_counter())  # [t0, t_fwd, t_ret, t_in, t_out, thread]
        torch.cuda.synchronize()
    finally:
        stage8._backward = inner
    rows = stamps[20:]
    if len(rows[0]) < 6:  # the C++ node (stages/autograd_node.py) runs the backward: stage8._backward never called
        print(f"step timeline: forward {statistics.median((r[1] - r[0]) * 1e6 for r in rows):.1f} µs, whole "
              f"{statistics.median((r[2] - r[0]) * 1e6 for r in rows):.1f} (the backward is the C++ node's: no stamps inside it)")
        return
    main_thread = threading.get_ident()
    med = lambda f: statistics.median(f(r) * 1e6 for r in rows)  # noqa: E731
    print(f"step timeline (median µs of {len(rows)} steps; backward on the "
          f"{'calling' if rows[0][5] == main_thread else 'engine'} thread):")
    print(f"  forward {med(lambda r: r[1] - r[0]):.1f}; grad() to backward entry {med(lambda r: r[3] - r[1]):.1f}; "
          f"backward {med(lambda r: r[4] - r[3]):.1f}; backward exit to grad() return {med(lambda r: r[2] - r[4]):.1f}; "
          f"whole {med(lambda r: r[2] - r[0]):.1f}")


def ctypes_launch(plan, pre_args, delta):
    """The preprocess launched through the driver by ctypes, its arguments packed once."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        func = int(plan.pre.handle)
        stream = int(nvrtc.current_stream().handle)
        cfg = plan.pre_config
        objs = []
        for a in pre_args:
            if isinstance(a, (np.int32,)):
                objs.append(ctypes.c_int32(int(a)))
            elif isinstance(a, np.int64):
                objs.append(ctypes.c_int64(int(a)))
            elif isinstance(a, np.float32):
                objs.append(ctypes.c_float(float(a)))
            else:
                objs.append(ctypes.c_uint64(int(a)))
        argv = (ctypes.c_void_p * len(objs))(*[ctypes.addressof(o) for o in objs])
        g, b = cfg.grid, cfg.block
        f = lib.cuLaunchKernel
        f.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]

        def launch():
            return f(func, g[0], g[1], g[2], b[0], b[1], b[2], cfg.shmem_size, stream, argv, None)

        ref = delta.clone()
        delta.zero_()
        rc = launch()
        if rc != 0:  # a CUkernel handle where the driver wants a CUfunction: ask for the function
            fn = ctypes.c_void_p()
            print(f"  cuLaunchKernel on the kernel handle: rc={rc}; cuKernelGetFunction rc="
                  f"{lib.cuKernelGetFunction(ctypes.byref(fn), ctypes.c_void_p(func))}")
            func = fn.value
            rc = launch()
        torch.cuda.synchronize()
        print(f"  ctypes cuLaunchKernel rc={rc}, delta as cuda.core's: {torch.equal(delta, ref)}")
        if rc == 0:
            row("  one launch (the preprocess, ctypes cuLaunchKernel)", launch)
    except Exception as e:  # a prototype: say why it could not run
        print(f"  ctypes launch not measured: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
