"""Stage 8's backward as a C++ autograd node: the default backward of
`stages.autograd.attention(q, k, v, forward=6, ...)` on an H100/H200 (training plumbing beside
the stages, not a stage: the kernels are stage 8's).

A training step through the Python `torch.autograd.Function` (`stage8.with_grad`) runs Python on
the autograd engine's thread; at the latency shape that made the step's host time about 1.5x
SDPA's on the H200, and this node brought it under SDPA's (experiments/cpp_autograd_node: the
probe, its log and its numbers). `stages/stage8_node.cpp` is built at first use by
`torch.utils.cpp_extension.load` (the host's C++ compiler, g++, and ninja; 20-60 s once, then
cached in the kernel cache, `lib.nvrtc.cache_dir() / "torch_extensions"`, which FA_CACHE_DIR
moves) and holds:

- a plan per input layout, made here from stage 8's own (`stage8._make_launch` with a contiguous
  stand-in dO): the three kernels stage 8 runs on sm_90 (preprocess, the WGMMA dK/dV kernel with
  dQ summed by bulk reductions and Q/dO loaded by TMA, postprocess) as driver handles, their grid,
  block and shared memory, their scalar arguments as 8-byte words, and the tensor maps of q and dO
  encoded in C++ (`lib.tma.tensor_map`'s parameters);
- the node: `attach(out, q, k, v, lse, plan)` makes the output's grad_fn a C++ node that saves
  q, k, v, the output and lse and whose backward allocates, retargets the maps when q or dO moved
  and makes three `cuLaunchKernel` calls on the current stream, binding the device's primary
  context first (the engine's thread may have none bound: issue 48's crash);
- stage 6's forward too, where its plan for the layout is one plain launch (no split keys, no
  packed heads): `forward(plan, q, k, v)` allocates the output and lse, retargets the forward's
  maps (q, k, v, the output) when they moved, launches stage 6's kernel on the plan's stream and
  attaches the node, without stage 6's Python (`FORWARD_REASONS` says per layout why not;
  FA_NODE_FORWARD=0, read at each call, keeps stage 6's Python call). Its kernel, grid and
  arguments are those stage 6's own plan gave its launch for the layout (found by making that
  call once, `_add_forward`); on another stream than the plan's, stage 6's Python call runs.

Which path a call takes (`route` says it in words):
  - the node when gradients are wanted and: forward 6, no `options` (stage 6's measuring
    keywords, softcap, window, sinks, seqlens_k), a CUDA device of compute capability 9.0 (the
    current device), fp16/bf16, head dim 64 or 128, a layout stage 8 plans without copies,
    16-byte aligned pointers, the extension built and the driver loaded;
  - otherwise the Python autograd.Function, exactly as before (`stage8.with_grad`). A bad input
    goes that way too, so its error is the stages' own (stage 6's validation), never the node's.
  - FA_AUTOGRAD_NODE=0 in the environment (read at each call) forces the Python Function
    everywhere: for measuring one against the other, or if the node misbehaves.
If the extension does not build (no g++ or ninja, a torch without its headers, ...): one warning
saying why, and the Python Function runs; never an exception.

Both paths give the same forward and the same dK, dV bits (the same kernels on the same inputs);
a second backward through the gradients (create_graph=True) raises as the Python Function's
once_differentiable does. Not tried: CUDA-graph capture of the backward, torch.compile (compiled
autograd does not know this node).
"""
from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from lib import inputs, nvrtc
from stages import stage6, stage8

SOURCE = Path(__file__).with_name("stage8_node.cpp")
NODE_NAME = "StagesAttentionBackward"  # stage8_node.cpp's AttentionBackward::name()
EXTENSION_NAME = "fa_stage8_node"
# How stage8_node.cpp reads the current stream: "guard" (c10's device-guard interface, no CUDA
# headers; builds against a CPU torch too) or "c10_cuda" (c10::cuda::getCurrentCUDAStream: CUDA's
# headers and libc10_cuda, for a torch whose CUDAGuardImpl lacks getStreamNativeHandle).
STREAM_API = os.environ.get("FA_AUTOGRAD_NODE_STREAM", "guard")
BUILD = {"seconds": None, "error": None}  # the extension's build (or cache load) time, and why it failed
_extension = None


def enabled() -> bool:
    """False when FA_AUTOGRAD_NODE=0 forces the Python autograd.Function (read at each call)."""
    return os.environ.get("FA_AUTOGRAD_NODE", "1").strip() != "0"


def forward_in_cpp() -> bool:
    """False when FA_NODE_FORWARD=0 keeps stage 6's forward in Python (read at each call)."""
    return os.environ.get("FA_NODE_FORWARD", "1").strip() != "0"


def build_directory() -> Path:
    """Where the extension is built: the kernel cache, one folder per Python and torch version
    (a module built against another torch would not load)."""
    v = sys.version_info
    d = nvrtc.cache_dir() / "torch_extensions" / f"{EXTENSION_NAME}-py{v.major}{v.minor}-torch{torch.__version__}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def extension():
    """stage8_node.cpp built and imported, or None when it cannot be (BUILD says why, after one
    warning). Built once per source, torch and Python; later processes load it from the cache."""
    global _extension
    if _extension is None and BUILD["error"] is None:
        started = time.perf_counter()
        try:
            _extension = _load()
        except Exception as e:  # noqa: BLE001 (any failure: say why once, the Python Function runs)
            BUILD["error"] = f"{type(e).__name__}: {str(e).strip()[-600:]}"
            warnings.warn(f"stages/autograd_node.py: stage 8's C++ autograd node did not build "
                          f"({BUILD['error']}); the Python autograd.Function runs the backward instead "
                          "(FA_AUTOGRAD_NODE=0 skips the build)", RuntimeWarning, stacklevel=2)
        BUILD["seconds"] = time.perf_counter() - started
    return _extension


def _load():
    from torch.utils.cpp_extension import CUDA_HOME, load
    name, cflags, ldflags, includes = EXTENSION_NAME, ["-O2"], ["-ldl"], []
    if STREAM_API == "c10_cuda":
        name, cflags, ldflags = name + "_c10cuda", cflags + ["-DNODE_C10_CUDA_STREAM"], ldflags + ["-lc10_cuda"]
        includes = [str(Path(CUDA_HOME or "/usr/local/cuda") / "include")]
    where = build_directory()
    _clear_stale_lock(where)
    built = where / f"{name}.so"
    if not built.exists() or built.stat().st_mtime < SOURCE.stat().st_mtime:
        _building(where)
    return load(name=name, sources=[str(SOURCE)], extra_cflags=cflags, extra_ldflags=ldflags,
                extra_include_paths=includes, build_directory=str(where),
                verbose=os.environ.get("FA_AUTOGRAD_NODE_VERBOSE") == "1")


STALE_LOCK_SECONDS = 600  # a build takes 20-60 s: a lock this old is a killed build's


def _clear_stale_lock(where: Path):
    """torch's load() waits, without limit, while its build folder's `lock` file exists, and a
    build killed midway (Ctrl-C, a CI timeout) leaves one behind: every later process would hang
    at its first training step. A lock older than any build is removed."""
    lock = where / "lock"
    try:
        if time.time() - lock.stat().st_mtime > STALE_LOCK_SECONDS:
            lock.unlink()
    except OSError:
        pass  # no lock (the usual case), or another process removed it first


def _building(where: Path):
    """One line before the build, as lib.nvrtc announces a compile (_compiling): to stderr when
    that is a terminal, FA_COMPILE_PROGRESS=1 forcing it and 0 silencing it."""
    flag = os.environ.get("FA_COMPILE_PROGRESS", "")
    if flag == "1" or (flag != "0" and sys.stderr.isatty()):
        print(f"building stage 8's C++ autograd node (once, about 30 s; cached in {where})…",
              file=sys.stderr, flush=True)


_MISSING = object()
_plans: dict = {}    # layout key -> the C++ plan, or None where the Python Function runs
REASONS: dict = {}   # layout key -> why that layout takes the Python Function
FORWARD_REASONS: dict = {}  # layout key with a plan -> "C++", or why its forward is stage 6's Python call
_kernels: dict = {}  # layout key -> stage 8's kernel objects (and stage 6's plan), kept alive beside their handles


def _key(q, k, v, causal, scale):
    return (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device, v.shape,
            v.stride(), v.dtype, v.device, causal, type(causal), scale, type(scale))


def attention(q, k, v, causal, scale):
    """Stage 6's forward with stage 8's backward as the C++ node: the output (its grad_fn the
    node), or None where the node does not apply (the caller then runs the Python Function).
    Called by stages.autograd.attention with gradients wanted, causal already SDPA's spelling
    mapped to the stages' and any attn_mask turned into causal."""
    if not enabled():
        return None
    plan = _plan(q, k, v, causal, scale)
    if plan is None or (q.data_ptr() | k.data_ptr() | v.data_ptr()) % stage8.INFO.align_bytes:
        return None
    if forward_in_cpp() and not inputs._poison:  # (poisoned outputs: lib.inputs.poison_outputs' tests)
        out = _extension.forward(plan, q, k, v)
        if out is not None:
            return out
    B, H, Sq, _ = q.shape
    lse = q.new_empty((B, H, Sq), dtype=torch.float32)
    torch._C._set_grad_enabled(False)  # as in an autograd.Function's forward (grad mode was on: gradients wanted)
    try:
        out = stage6.attention(q, k, v, causal=causal, scale=scale, lse=lse)
    finally:
        torch._C._set_grad_enabled(True)
    _extension.attach(out, q, k, v, lse, plan)
    return out


def route(q, k, v, causal=False, scale=None) -> str:
    """Which backward stages.autograd.attention(q, k, v, forward=6, causal=..., scale=...) would
    attach for these inputs (gradients wanted, no options), and why: "node" or "python: <reason>"."""
    if not enabled():
        return "python: FA_AUTOGRAD_NODE=0"
    if _plan(q, k, v, causal, scale) is None:
        try:
            reason = REASONS.get(_key(q, k, v, causal, scale))
        except Exception:  # noqa: BLE001
            reason = None
        return f"python: {reason or 'not tensors the node plans for'}"
    if (q.data_ptr() | k.data_ptr() | v.data_ptr()) % stage8.INFO.align_bytes:
        return f"python: a pointer not {stage8.INFO.align_bytes}-byte aligned"
    return "node"


def plan_for(q, k, v, causal=False, scale=None):
    """The C++ plan attention() uses for this layout, or None (route says why)."""
    return _plan(q, k, v, causal, scale)


def backward(plan, q, k, v, out, dout, lse):
    """(dq, dk, dv) by the plan, called directly (no autograd): for timing against
    stage8.attention_backward."""
    return plan.run(q, k, v, out, dout, lse)


def _plan(q, k, v, causal, scale):
    try:
        key = _key(q, k, v, causal, scale)
        plan = _plans.get(key, _MISSING)
    except Exception:  # noqa: BLE001 (not tensors, unhashable scale: the Python path says what is wrong)
        return None
    if plan is _MISSING:
        if len(_plans) > 1024:
            _plans.clear()
            REASONS.clear()
            FORWARD_REASONS.clear()
            _kernels.clear()
        plan = _plans[key] = _make_plan(q, k, v, causal, scale, key)
    return plan


def _refuse(key, reason: str):
    REASONS[key] = reason
    return None


def _make_plan(q, k, v, causal, scale, key):
    """The C++ plan of one layout (stage8_node.cpp's Plan), from stage 8's own plan for it; None
    (and REASONS[key]) where the Python Function runs. The cheap checks come first: an input the
    node cannot take never builds the extension."""
    ts = (q, k, v)
    if not all(isinstance(t, torch.Tensor) and t.is_cuda and t.dim() == 4 for t in ts):
        return _refuse(key, "q, k and v are not all 4-D CUDA tensors")
    if q.device.index != torch.cuda.current_device() or any(t.device != q.device for t in ts):
        return _refuse(key, "q, k and v are not all on the current CUDA device")
    if not stage8.wgmma_here():
        return _refuse(key, "needs a GPU of compute capability 9.0 (stage 8's WGMMA build)")
    if q.dtype not in (torch.float16, torch.bfloat16) or any(t.dtype != q.dtype for t in ts):
        return _refuse(key, "q, k and v are not all float16 or all bfloat16")
    if q.shape[-1] not in (64, 128):
        return _refuse(key, f"head dim {q.shape[-1]}: the node takes 64 and 128 (stage 8's)")
    ext = extension()
    if ext is None:
        return _refuse(key, f"the C++ extension did not build: {BUILD['error']}")
    if ext.driver_problem():
        return _refuse(key, ext.driver_problem())
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
    except Exception as e:  # noqa: BLE001 (the Python path raises the stages' own error)
        return _refuse(key, f"stage 8 refuses the layout: {type(e).__name__}: {e}")
    if p.empty:
        return _refuse(key, "no products (no query or no key): stage 8 returns zeros")
    if not (p.wgmma_acc and p.bulk and p.tma and p.post is not None):
        return _refuse(key, "stage 8's build here is not WGMMA with DQ_BULK and TMA_LOADS")
    if p.copy_out or p.copy_dout or not p.lse_ready:
        return _refuse(key, "stage 8 would copy the output, dO or lse for this layout")
    try:
        configs = [_config(c) for c in (p.pre_config, p.main_config, p.post_config)]
        pre_args, shape_args, post_args = (_scalars(a, ext.KINDS) for a in (p.pre_args, p.shape_args, p.post_args))
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
    plan.encode_map(0, q0, p.rows)  # stage 8's tensor_map(q, p.rows): boxes of a step's query rows
    plan.encode_map(1, dout, p.rows)  # ... and tensor_map(dout, p.rows), for the plan's dO layout
    kernels = [p.pre, p.main, p.post]
    FORWARD_REASONS[key] = _add_forward(plan, ext, q0, k0, v0, causal, scale, kernels)
    _kernels[key] = tuple(kernels)
    return plan


def _add_forward(plan, ext, q, k, v, causal, scale, kernels: list) -> str:
    """Stage 6's forward of this layout added to the C++ plan (a launch named "forward", the maps of
    q, k, v and the output): the kernel stage 6 runs for attention(q, k, v, causal=, scale=, lse=),
    found by running that call once and keeping the plan its launch was given. Then a step's
    forward allocates, retargets and launches in C++, without stage 6's Python (its host time is
    what the training map's short rows wait on in slow spells: experiments/train_step_rounds,
    probe_phases). Returns "C++" (stage 6's plan appended to `kernels`: its kernel and its work queue,
    whose handle and pointer the C++ plan holds, then live as long as the node's plan, even if stage 6
    drops its own plans), or why the forward stays stage 6's Python call."""
    B, H, Sq, _ = q.shape
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    given, launch, me = [], stage6._launch, threading.get_ident()

    def keep(plan6, *a, **kw):
        if threading.get_ident() == me:  # (another thread's stage 6 call in the meantime: not this layout's)
            given.append(plan6)
        return launch(plan6, *a, **kw)
    stage6._launch = keep  # this thread is making the node's plan; stage 6's own plan is found once
    try:
        with torch.no_grad():
            out = stage6.attention(q, k, v, causal=causal, scale=scale, lse=lse)
    except Exception as e:  # noqa: BLE001 (the Python path raises stage 6's own error)
        return f"stage 6 refuses the layout: {type(e).__name__}: {e}"
    finally:
        stage6._launch = launch
    if len(given) != 1:
        return "stage 6 made no single launch for this layout"
    p6 = given[0]
    if (p6.trivial or p6.splits != 1 or p6.combine_config is not None or p6.group or p6.varlen
            or p6.variant_args is not None or p6.max_pages is not None or p6.kv_fp8):
        return "stage 6's plan is not one plain launch (split keys, packed heads, variants, pages or e4m3)"
    try:
        config = _config(p6.config)
        args = _scalars(p6.args, ext.KINDS)
    except (TypeError, ValueError) as e:
        return str(e)
    S, K = ext.SLOTS, ext.KINDS
    zero = (K["i64"], 0)  # a null pointer
    queue = stage6._queue(p6, q.device)  # DYNAMIC_WORK's counter for the current stream (0: none)
    # stages/stage6.py `_launch`'s arguments, in its order: the maps of q, k, v and the output (q's
    # where stage 6 stores without TMA), out, o_part, lse_part, the plan's scalars, timeline, the work
    # queue, split counts, cu_q, cu_k, used_k, lse
    words = ([(K["map"], 2), (K["map"], 3), (K["map"], 4), (K["map"], 5 if p6.o_tma else 2), (K["slot"], S["out"]),
              zero, zero] + args + [zero, (K["i64"], queue), zero, zero, zero, zero, (K["slot"], S["lse"])])
    plan.add_launch("forward", int(p6.kernel.handle), *config, words)
    for i, t in enumerate((q, k, v, out)[:4 if p6.o_tma else 3]):
        plan.encode_map(2 + i, t, p6.rows[i])
    plan.set_forward_stream(torch.cuda.current_stream(q.device).cuda_stream)
    kernels.append(p6)
    return "C++"


def _config(cfg) -> tuple:
    """(grid, block, shared memory bytes) of a cuda.core LaunchConfig of a plain launch."""
    if getattr(cfg, "cluster", None) or getattr(cfg, "programmatic_stream_serialization", False) \
            or getattr(cfg, "is_cooperative", False):
        raise ValueError("a launch with clusters, PDL or cooperative groups: not in the node's plans")

    def dims(x):
        return [int(x)] if isinstance(x, int) else [int(n) for n in x]
    return dims(cfg.grid), dims(cfg.block), int(cfg.shmem_size or 0)


def _scalars(args, kinds: dict) -> list:
    """Stage 8's scalar arguments as stage8_node.cpp's (kind, value) pairs: numpy int32, int64
    and float32 (its bits), what lib.nvrtc passes cuda.core."""
    out = []
    for a in args:
        if isinstance(a, np.int32):
            out.append((kinds["i32"], int(a)))
        elif isinstance(a, np.int64):
            out.append((kinds["i64"], int(a)))
        elif isinstance(a, np.float32):
            out.append((kinds["f32"], int(np.array(a, dtype=np.float32).view(np.uint32))))
        else:
            raise TypeError(f"a scalar argument of type {type(a).__name__}: not in the node's plans")
    return out
