"""Issue 48, item 3 (prototype, not wired into the stages): stage 6's forward with stage 8's
backward as a C++ autograd node (node.cpp), so that the autograd engine's thread runs no Python.

    from experiments.cpp_autograd_node.attention import attention
    out = attention(q, k, v, causal=True)     # stage 6's forward, lse saved
    out.backward(dout)                         # stage 8's kernels, launched from C++

The forward is stage 6's with `lse=`, run with grad mode off; then `attach` (node.cpp) makes the
output's grad_fn a C++ node that holds q, k, v, the output and lse as SavedVariables and a plan:
stage 8's own plan for the layout (`stages.stage8._make_launch`: the kernels, their launch
configurations and scalar arguments) turned into driver handles and argument words, with the tensor
maps of q and dO encoded in C++ (the parameters of `lib.tma.tensor_map`). Its backward allocates one
float32 workspace and dq, dk, dv with at::empty, retargets the maps when q or dO moved, and makes
three cuLaunchKernel calls (preprocess, dK/dV with dQ summed by bulk reductions, postprocess) on the
current stream: what stage 8's `_run` does for the build it runs on an H100/H200.

Supported (anything else falls back to `stages.autograd.attention(q, k, v, forward=6, ...)`, the
Python autograd.Function, and `why_not` says why):
  - a CUDA GPU of compute capability 9.0 (stage 8's WGMMA build), fp16/bf16, D 64 or 128, any
    B, H, GQA, Sq, Sk, causal False/True/"top_left"/"bottom_right", scale, and q, k, v of any
    layout stage 6 and stage 8 take (16-byte aligned pointers);
  - stage 8's default build for the head dim, which on sm_90 is WGMMA with dQ summed by bulk
    reductions and Q/dO loaded by TMA (WGMMA_BUILD, D 64 and D 128 alike): three launches;
  - dO of any layout (copied to a contiguous tensor when it is not one, as the plan assumes).
Not supported: other GPUs or stage 8 builds (mma.sync, the dQ pass, atomics without DQ_BULK),
empty problems (no query, no key), attn_mask and the SDPA keywords, stage 6's measuring options,
seqlens_k, packed sequences; the C++ extension not building or the driver not loading (then one
warning and the fallback). A second backward through the gradients (create_graph=True) raises in
the backward: the node's gradients have no backward of their own. Not tried: CUDA-graph capture,
torch.compile (compiled autograd does not know this node).
"""
from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from lib import nvrtc  # noqa: E402
from lib.inputs import wants_grad  # noqa: E402
from stages import autograd as stages_autograd  # noqa: E402
from stages import stage6, stage8  # noqa: E402

SOURCE = Path(__file__).with_name("node.cpp")
NODE_NAME = "StagesAttentionBackward"  # node.cpp's AttentionBackward::name()
# How node.cpp reads the current stream: "guard" (c10's device-guard interface, no CUDA headers;
# builds against a CPU torch too) or "c10_cuda" (c10::cuda::getCurrentCUDAStream: CUDA's headers
# and libc10_cuda, for a torch whose CUDAGuardImpl lacks getStreamNativeHandle).
STREAM_API = os.environ.get("FA_CPP_NODE_STREAM", "guard")
BUILD = {"seconds": None, "error": None}  # the extension's build (or cache load) time, and why it failed
_ext = None


def extension():
    """node.cpp built and imported (torch.utils.cpp_extension.load: g++ and ninja; cached under
    TORCH_EXTENSIONS_DIR, rebuilt when the source changes), or None when it cannot be: BUILD says
    why and how long it took."""
    global _ext
    if _ext is None and BUILD["error"] is None:
        from torch.utils.cpp_extension import CUDA_HOME, load
        started = time.perf_counter()
        name, cflags, ldflags, includes = "fa_cpp_autograd_node", ["-O2"], ["-ldl"], []
        if STREAM_API == "c10_cuda":
            name, cflags, ldflags = name + "_c10cuda", cflags + ["-DNODE_C10_CUDA_STREAM"], ldflags + ["-lc10_cuda"]
            includes = [str(Path(CUDA_HOME or "/usr/local/cuda") / "include")]
        try:
            _ext = load(name=name, sources=[str(SOURCE)], extra_cflags=cflags, extra_ldflags=ldflags,
                        extra_include_paths=includes, verbose=os.environ.get("FA_CPP_NODE_VERBOSE") == "1")
        except Exception as e:  # noqa: BLE001 (a prototype: say why, fall back)
            BUILD["error"] = f"{type(e).__name__}: {e}"
            warnings.warn(f"experiments/cpp_autograd_node: the C++ extension did not build ({BUILD['error'][:300]}); "
                          "falling back to stages.autograd.attention", stacklevel=3)
        BUILD["seconds"] = time.perf_counter() - started
    return _ext


_MISSING = object()
_plans: dict = {}   # layout key -> the C++ plan, or None where the fallback runs
REASONS: dict = {}  # layout key -> why that layout falls back
_kernels: dict = {}  # layout key -> stage 8's kernel objects, kept alive beside their handles


def _key(q, k, v, causal, scale):
    return (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device, v.shape,
            v.stride(), v.dtype, v.device, causal, type(causal), scale, type(scale))


def attention(q, k, v, causal=False, scale=None):
    """F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
    with gradients: stage 6's forward and, when grad mode is on and q, k or v requires grad, an
    output whose grad_fn is the C++ node (stage 8's kernels). The module docstring says what
    falls back to stages.autograd.attention."""
    if not wants_grad(q, k, v):
        return stage6.attention(q, k, v, causal=causal, scale=scale)
    try:
        key = _key(q, k, v, causal, scale)
        plan = _plans.get(key, _MISSING)
    except Exception:  # noqa: BLE001 (not tensors: the fallback's validation says what is wrong)
        key, plan = None, None
    if plan is _MISSING:
        plan = _plans[key] = _make_plan(q, k, v, causal, scale, key)
    if plan is None or (q.data_ptr() | k.data_ptr() | v.data_ptr()) % stage8.INFO.align_bytes:
        return stages_autograd.attention(q, k, v, forward=6, causal=causal, scale=scale)
    B, H, Sq, _ = q.shape
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    torch._C._set_grad_enabled(False)  # stage 6 refuses inputs that require grad in grad mode
    try:
        out = stage6.attention(q, k, v, causal=causal, scale=scale, lse=lse)
    finally:
        torch._C._set_grad_enabled(True)
    _ext.attach(out, q, k, v, lse, plan)
    return out


def why_not(q, k, v, causal=False, scale=None) -> str | None:
    """Why attention() falls back for this layout (None: it does not), planning it if need be."""
    key = _key(q, k, v, causal, scale)
    if key not in _plans:
        _plans[key] = _make_plan(q, k, v, causal, scale, key)
    return REASONS.get(key)


def plan_for(q, k, v, causal=False, scale=None):
    """The C++ plan attention() uses for this layout, or None (why_not says why)."""
    why_not(q, k, v, causal, scale)
    return _plans[_key(q, k, v, causal, scale)]


def backward(plan, q, k, v, out, dout, lse):
    """(dq, dk, dv) by the plan, called directly (no autograd): for timing against
    stage8.attention_backward."""
    return plan.run(q, k, v, out, dout, lse)


def _refuse(key, reason: str):
    REASONS[key] = reason
    return None


def _make_plan(q, k, v, causal, scale, key):
    """The C++ plan of one layout (node.cpp's Plan), from stage 8's own plan for it; None (and
    REASONS[key]) where the prototype falls back."""
    ext = extension()
    if ext is None:
        return _refuse(key, f"the extension did not build: {BUILD['error']}")
    if ext.driver_problem():
        return _refuse(key, ext.driver_problem())
    if not (isinstance(q, torch.Tensor) and q.is_cuda and q.dim() == 4):
        return _refuse(key, "q must be a [B, H, S, D] CUDA tensor")
    if not stage8.wgmma_here():
        return _refuse(key, "needs a GPU of compute capability 9.0 (stage 8's WGMMA build)")
    q0, k0, v0 = q.detach(), k.detach(), v.detach()
    B, H, Sq, D = q.shape
    # Stand-ins for what the plan assumes: stage 6's output (lib.inputs.new_output: contiguous),
    # a contiguous dO (the node copies any other), lse as attention() allocates it.
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dout = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    try:
        with torch.no_grad():
            p = stage8._make_launch(q0, k0, v0, out, dout, lse, causal, scale, None, None, None, {})
    except Exception as e:  # noqa: BLE001 (the fallback raises the stage's own error)
        return _refuse(key, f"stage 8 refuses the layout: {type(e).__name__}: {e}")
    if p.empty:
        return _refuse(key, "no products (no query or no key): stage 8 returns zeros")
    if not (p.wgmma_acc and p.bulk and p.tma and p.post is not None):
        return _refuse(key, "stage 8's build here is not WGMMA with DQ_BULK and TMA_LOADS")
    if p.copy_out or p.copy_dout or not p.lse_ready:
        return _refuse(key, "stage 8 would copy the output, dO or lse for this layout")
    try:
        configs = [_config(c) for c in (p.pre_config, p.main_config, p.post_config)]
        pre_args, shape_args, post_args = (_scalars(a) for a in (p.pre_args, p.shape_args, p.post_args))
    except (TypeError, ValueError) as e:
        return _refuse(key, str(e))
    S, K = ext.SLOTS, ext.KINDS

    def slots(*names):
        return [(K["slot"], S[n]) for n in names]

    nvrtc._device()  # this thread's context bound (stage 8 bound it loading its kernels, if it loaded them here)
    plan = ext.Plan()
    plan.capture_context()  # that context: the device's primary one, torch's and cuda.core's
    plan.set_layout(list(q.shape), list(k.shape), p.work_floats, 0, p.rows_pad, p.acc_at)
    # The argument lists of stages/stage8.py `_run`, in its order (the kernels' signatures):
    #   preprocess (dout, out, lse, delta, lse2, dq_zero, *pre_args)
    #   attention_backward (q_map, dout_map, q, k, v, dout, lse2, delta, dq_accum, dk, dv, *shape_args)
    #   postprocess (acc, dq, *post_args)
    plan.add_launch("preprocess", int(p.pre.handle), *configs[0],
                    slots("dout", "out", "lse", "delta", "lse2", "acc") + pre_args)
    plan.add_launch("attention_backward", int(p.main.handle), *configs[1],
                    [(K["map"], 0), (K["map"], 1)] + slots("q", "k", "v", "dout", "lse2", "delta", "acc", "dk", "dv")
                    + shape_args)
    plan.add_launch("postprocess", int(p.post.handle), *configs[2], slots("acc", "dq") + post_args)
    plan.encode_map(0, q0, stage8.DQ_ROWS)  # stage 8's tensor_map(q, DQ_ROWS)
    plan.encode_map(1, dout, stage8.DQ_ROWS)  # ... and tensor_map(dout, DQ_ROWS), for the plan's dO layout
    _kernels[key] = (p.pre, p.main, p.post)
    return plan


def _config(cfg) -> tuple:
    """(grid, block, shared memory bytes) of a cuda.core LaunchConfig of a plain launch."""
    if getattr(cfg, "cluster", None) or getattr(cfg, "programmatic_stream_serialization", False) \
            or getattr(cfg, "is_cooperative", False):
        raise ValueError("a launch with clusters, PDL or cooperative groups: not in the prototype")

    def dims(x):
        return [int(x)] if isinstance(x, int) else [int(n) for n in x]
    return dims(cfg.grid), dims(cfg.block), int(cfg.shmem_size or 0)


def _scalars(args) -> list:
    """Stage 8's scalar arguments as node.cpp's (kind, value) pairs: numpy int32, int64 and
    float32 (its bits), what lib.nvrtc passes cuda.core."""
    K = _ext.KINDS
    out = []
    for a in args:
        if isinstance(a, np.int32):
            out.append((K["i32"], int(a)))
        elif isinstance(a, np.int64):
            out.append((K["i64"], int(a)))
        elif isinstance(a, np.float32):
            out.append((K["f32"], int(np.array(a, dtype=np.float32).view(np.uint32))))
        else:
            raise TypeError(f"a scalar argument of type {type(a).__name__}: not in the prototype")
    return out
