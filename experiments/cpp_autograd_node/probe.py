"""Issue 48, item 3: does stage 8's backward as a C++ autograd node bring a training step's host
time within 1.2x SDPA's at the latency shape? The node is now stages.autograd.attention's default
backward (stages/autograd_node.py, stages/stage8_node.cpp); this probe compares it with the Python
autograd.Function through the FA_AUTOGRAD_NODE switch (1: the node, 0: the Python Function).

In order (an H100/H200; the GPU session runs it as is):
  1. the extension's build, timed (g++ and ninja through torch.utils.cpp_extension; a build
     already cached for this source loads in about a second);
  2. the tensor maps node.cpp encodes against cuda.core's for the same tensors (lib.tma), byte for
     byte where cuda.core's object can be read;
  3. gradients against lib.reference.check_gradients (the float64 autograd rule) on odd shapes
     first: B2 H4/2 Sq130 Sk200 at D 64 and D 128, full and causal both ways; then a [B, S, H, D]
     layout with a strided dO, the latency shape, a side stream, retain_graph. Beside the rule,
     dK and dV must be the same bits as the Python Function's (FA_AUTOGRAD_NODE=0: the same
     kernels on the same inputs; dQ's bulk sums may differ in their last bits from run to run);
  4. host time per step as experiments/train_step_host/breakdown.py measures it (wall time per
     call of 300 back-to-back calls, one synchronization at the end), SDPA's step, the stage 6+8
     step through the Python autograd.Function and through the C++ node in the same run, their
     repeats interleaved; each row's ratio to SDPA's is the median of the per-round ratios.

    python3 experiments/cpp_autograd_node/probe.py [--repeats 7] [--calls 300]
"""
import argparse
import contextlib
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib import nvrtc  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_gradients  # noqa: E402
from lib.tma import tensor_map  # noqa: E402
from stages import autograd, stage6, stage8  # noqa: E402
from stages import autograd_node as A  # noqa: E402

DT = torch.bfloat16


@contextlib.contextmanager
def switch(value: str):
    """FA_AUTOGRAD_NODE=value inside: "1" the C++ node, "0" the Python autograd.Function."""
    before = os.environ.get("FA_AUTOGRAD_NODE")
    os.environ["FA_AUTOGRAD_NODE"] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("FA_AUTOGRAD_NODE", None)
        else:
            os.environ["FA_AUTOGRAD_NODE"] = before


def node_attention(q, k, v, **kw):
    with switch("1"):
        return autograd.attention(q, k, v, forward=6, **kw)


def python_attention(q, k, v, **kw):
    with switch("0"):
        return autograd.attention(q, k, v, forward=6, **kw)


def build():
    ext = A.extension()
    print(f"extension build (or cached load): {A.BUILD['seconds']:.2f} s"
          + (f"; FAILED: {A.BUILD['error']}" if ext is None else ""), flush=True)
    if ext is None:
        sys.exit(1)
    import cuda.core
    print(f"torch {torch.__version__}, cuda.core {cuda.core.__version__}, {torch.cuda.get_device_name()}, node "
          f"pointer {ext.node_pointer()}, driver {ext.driver_problem() or 'loaded'}", flush=True)
    return ext


def map_bytes(ext):
    """node.cpp's encoding of q's map against lib.tma.tensor_map's (cuda.core's descriptor keeps
    the 128-byte CUtensorMap inside its object: looked for there)."""
    nvrtc._device()  # a context bound on this thread
    base = torch.randn(2, 130, 4, 64, device="cuda", dtype=DT)
    for name, t in (("contiguous B2 H4 S130 D64", base.transpose(1, 2).contiguous()),
                    ("[B, S, H, D] view B2 H4 S130 D64", base.transpose(1, 2)),
                    ("B1 H1 S200 D128", torch.randn(1, 1, 200, 128, device="cuda", dtype=DT))):
        plan = ext.Plan()
        plan.encode_map(0, t, stage8.DQ_ROWS)
        ours = plan.map_bytes(0)
        desc = tensor_map(t, stage8.DQ_ROWS)
        raw = ctypes.string_at(id(desc), type(desc).__basicsize__)
        at = raw.find(ours)
        print(f"  map {name}: " + (f"the same 128 bytes as cuda.core's (at +{at} in its object)" if at >= 0 else
                                     "not found in cuda.core's object (bytes differ, or its layout is not "
                                     "what this check assumes: the gradients below decide)"), flush=True)


def grads_of(fn, q, k, v, dout, **kw):
    out = fn(q, k, v, **kw)
    return out, torch.autograd.grad(out, (q, k, v), dout)


def check(B, H, Hk, Sq, Sk, D, causal, *, layout="contiguous", dout_layout="contiguous", stream=None):
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=DT)
    if layout == "bshd":  # [B, S, H, D] storage seen as [B, H, S, D]
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    dout = torch.randn(q.shape, device=q.device, dtype=DT)
    if dout_layout == "strided":
        dout = torch.randn(B, Sq, H, D, device=q.device, dtype=DT).transpose(1, 2)
    with switch("1"):
        route = A.route(q, k, v, causal)
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream())  # the inputs were made on this one
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        out, got = grads_of(node_attention, q, k, v, dout, causal=causal)
        node = out.grad_fn.name()
        out_ref, ref = grads_of(python_attention, q, k, v, dout, causal=causal)
    if stream is not None:
        stream.synchronize()
    verdicts = check_gradients(got, q, k, v, dout, causal=causal)
    same = torch.equal(out, out_ref) and torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])
    dq = float((got[0].float() - ref[0].float()).abs().max())
    ok = all(c.passed for c in verdicts.values()) and node == A.NODE_NAME and same
    name = f"B{B} H{H}/{Hk} Sq{Sq} Sk{Sk} D{D} causal={causal}" + (f" {layout}" if layout != "contiguous" else "") \
        + (f" dO {dout_layout}" if dout_layout != "contiguous" else "") + (" side stream" if stream is not None else "")
    print(f"  {'PASS' if ok else 'FAIL'} {name}: node {node} (route: {route}); "
          + "; ".join(f"{n} {'ok' if c.passed else 'FAIL'} {c.max_abs_err:.2e} <= {c.tolerance:.2e}"
                      for n, c in verdicts.items())
          + f"; out, dK, dV {'same bits as' if same else 'DIFFER from'} the Python Function's; dQ max diff {dq:.2e}",
          flush=True)
    return ok


def checks(ext):
    ok = True
    for D in (64, 128):
        for causal in (False, "top_left", "bottom_right"):
            ok &= check(2, 4, 2, 130, 200, D, causal)
    ok &= check(2, 4, 2, 130, 200, 64, "top_left", layout="bshd", dout_layout="strided")
    ok &= check(2, 4, 2, 200, 130, 128, "bottom_right")  # a row that sees no key
    ok &= check(1, 8, 8, 512, 512, 64, False)  # the timing shape
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        same_stream = ext.current_stream(torch.cuda.current_device()) == torch.cuda.current_stream().cuda_stream
    print(f"  {'PASS' if same_stream else 'FAIL'} current stream seen by the node = torch's inside torch.cuda.stream(s)")
    ok &= same_stream
    ok &= check(2, 4, 2, 130, 200, 64, True, stream=side)
    # retain_graph: twice the same dK, dV; then the saved tensors are gone
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 4, 130, 64, Sk=200, dtype=DT))
    dout = torch.randn_like(q)
    out = node_attention(q, k, v)
    g1 = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    g2 = torch.autograd.grad(out, (q, k, v), dout)
    try:
        torch.autograd.grad(out, (q, k, v), dout)
        raised = "no error"
    except RuntimeError as e:
        raised = str(e).splitlines()[0][:90]
    retain = torch.equal(g1[1], g2[1]) and torch.equal(g1[2], g2[2]) and raised != "no error"
    print(f"  {'PASS' if retain else 'FAIL'} retain_graph twice, then released: third backward says: {raised}")
    return ok & retain


def interleaved(rows: dict, calls: int, repeats: int) -> dict:
    """Host µs per call of each row: `repeats` rounds, each running every row `calls` times back to
    back with one synchronization at its end (breakdown.py's wall()). A row is a function, or
    (FA_AUTOGRAD_NODE's value, function): the switch is set outside the timed loop."""
    rows = {name: row if isinstance(row, tuple) else ("1", row) for name, row in rows.items()}
    for value, fn in rows.values():
        with switch(value):
            for _ in range(5):
                fn()
    torch.cuda.synchronize()
    times = {name: [] for name in rows}
    for _ in range(repeats):
        for name, (value, fn) in rows.items():
            with switch(value):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                torch.cuda.synchronize()
                times[name].append((time.perf_counter() - t0) / calls * 1e6)
    return times


def report(title: str, times: dict, base: str):
    print(f"{title:60s} {'median':>8s} {'least':>8s} {'/ ' + base[:10]:>12s}")
    for name, ts in times.items():
        ratio = statistics.median(t / b for t, b in zip(ts, times[base]))
        print(f"  {name:58s} {statistics.median(ts):8.1f} {min(ts):8.1f} {ratio:11.3f}x", flush=True)


def timing(calls: int, repeats: int):
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for B, H, S, D in ((1, 8, 512, 64), (8, 16, 1024, 64)):
        q, k, v = (t.requires_grad_() for t in make_qkv(B, H, S, D, dtype=DT))
        do = torch.randn_like(q)
        with switch("1"):
            print(f"node at B{B} H{H} S{S} D{D}: {node_attention(q, k, v).grad_fn.name()} "
                  f"(route: {A.route(q, k, v)})")
        step = lambda: torch.autograd.grad(autograd.attention(q, k, v, forward=6), (q, k, v), do)  # noqa: E731
        steps = {
            "SDPA step": lambda: torch.autograd.grad(sdpa(q, k, v), (q, k, v), do),
            "stage 6+8 step (Python autograd.Function, FA_AUTOGRAD_NODE=0)": ("0", step),
            "stage 6+8 step (C++ node, the default)": ("1", step),
        }
        report(f"B{B} H{H} S{S} D{D} bf16 step: host µs per call", interleaved(steps, calls, repeats), "SDPA step")
        if (B, H, S, D) != (1, 8, 512, 64):
            continue
        with torch.no_grad():
            lse = torch.empty((B, H, S), dtype=torch.float32, device=q.device)
            out = stage6.attention(q, k, v, lse=lse)
            plan = A.plan_for(q, k, v)
            parts = {
                "stage 8 backward, called directly": lambda: stage8.attention_backward(q, k, v, out, do, lse),
                "C++ plan.run, called directly": lambda: A.backward(plan, q, k, v, out, do, lse),
            }
            report("  the backward alone (no autograd)", interleaved(parts, calls, repeats),
                   "stage 8 backward, called directly")
        fwd_only = lambda: autograd.attention(q, k, v, forward=6)  # noqa: E731
        fwd = {
            "SDPA forward, graph kept": lambda: sdpa(q, k, v),
            "stage 6 forward + Python Function, graph kept": ("0", fwd_only),
            "stage 6 forward + C++ node, graph kept": ("1", fwd_only),
        }
        report("  the forward alone", interleaved(fwd, calls, repeats), "SDPA forward, graph kept")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--skip-checks", action="store_true")
    a = ap.parse_args()
    ext = build()
    ok = True
    if not a.skip_checks:
        map_bytes(ext)
        print("gradients (lib.reference.check_gradients, bf16):", flush=True)
        ok = checks(ext)
        print(f"checks: {'PASS' if ok else 'FAIL'}", flush=True)
    timing(a.calls, a.repeats)
    print(f"extension build (or cached load) took {A.BUILD['seconds']:.2f} s; checks {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
