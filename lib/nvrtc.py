"""CUDA C++ at run time: NVRTC through NVIDIA's cuda.core, an on-disk cubin cache, and
launches on torch's current stream.

Compiling needs no GPU (cubin output needs no driver), so CPU machines compile every CUDA
C++ stage for its target arch and inspect it (lib.sass). Pitfalls this module handles:
- scalars must be numpy scalars (np.int32 / np.float32): a Python float would be a double;
- NVRTC needs include paths for mma.h (CUDA's include dir) and CCCL;
- we compile to cubin, not PTX, so what runs is exactly what lib.sass shows.
"""
from __future__ import annotations

import hashlib
import io
import math
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from lib.inputs import causal_mode, new_output, refuse_grad, trivial_output, validate
from lib.simulator import require_gpu

ROOT = Path(__file__).resolve().parent.parent
HEADER_DIRS = (ROOT / "stages",)  # where stages' shared headers (*.cuh) live


@lru_cache(maxsize=None)
def nvrtc_version() -> str:
    from cuda.bindings import nvrtc
    err, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


@lru_cache(maxsize=None)
def include_dirs() -> tuple[str, ...]:
    """CUDA's headers (mma.h, cuda_fp16.h) and CCCL's: from the pip wheels, else CUDA_HOME."""
    dirs = []
    try:
        import cuda.pathfinder as pf
        for lib in ("cudart", "cccl"):
            d = pf.find_nvidia_header_directory(lib)
            if d:
                dirs.append(d)
    except Exception:  # pathfinder missing or too old: fall back to the toolkit
        pass
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    for d in (Path(home) / "include", Path(home) / "include" / "cccl"):
        if d.is_dir():
            dirs.append(str(d))
    dirs = [d for d in dict.fromkeys(dirs) if d]
    if not any((Path(d) / "mma.h").exists() for d in dirs):
        raise RuntimeError("CUDA headers (mma.h) not found: install the nvidia-cuda-runtime "
                           "and nvidia-cuda-crt wheels (pip install -e .) or set CUDA_HOME")
    return tuple(dirs)


def include_path() -> list[str]:
    """NVRTC's include path: CUDA's and CCCL's headers, then the stages' own (HEADER_DIRS,
    read at call time)."""
    return list(include_dirs()) + [str(d) for d in HEADER_DIRS]


def cache_dir() -> Path:
    d = Path(os.environ.get("FA_CACHE_DIR", Path.home() / ".cache" / "fa-stages"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def gpu_arch(device=0, arch_specific=False) -> str:
    """The current GPU's arch, e.g. 'sm_90' (or 'sm_90a' with arch_specific)."""
    require_gpu("choosing the GPU's arch")
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if arch_specific else "")


@dataclass
class Compiled:
    """A cubin and what ptxas said about it."""

    cubin: bytes
    log: str
    arch: str
    key: str
    path: Path

    def resource_usage(self) -> dict:
        """Per-kernel registers, stack, spills and shared memory, from ptxas -v."""
        return parse_ptxas_log(self.log)


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def local_headers(source: str, dirs=None) -> list[Path]:
    """Every local header the source reaches through `#include "..."`, followed recursively
    (a header's includes are looked up beside it first, then in `dirs`, as NVRTC does), in the
    order first reached. Headers NVRTC finds elsewhere (CUDA's own, `<...>`) are not local."""
    dirs = tuple(HEADER_DIRS if dirs is None else dirs)
    found: list[Path] = []
    todo = [(source, None)]
    while todo:
        text, here = todo.pop(0)
        for name in _INCLUDE.findall(text):
            for d in ((here,) if here else ()) + dirs:
                p = (Path(d) / name).resolve()
                if p.is_file():
                    if p not in found:
                        found.append(p)
                        todo.append((p.read_text(), p.parent))
                    break
    return found


def headers_digest(source: str, dirs=None) -> str:
    """sha256 over every local header the source reaches (local_headers): editing any of
    them, however deeply it is included, changes the cache key and so recompiles."""
    h = hashlib.sha256()
    for p in local_headers(source, dirs):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def cache_key(source: str, *, arch: str, defines: dict | None = None,
              options: tuple[str, ...] = (), dirs=None) -> str:
    """The cubin cache's key. It covers: the source text; every local header it reaches,
    recursively (headers_digest); the defines; the ptxas options; the arch; NVRTC's version.
    It does not cover CUDA's own headers (they change with NVRTC's version, which it covers)."""
    defines = dict(sorted((defines or {}).items()))
    return hashlib.sha256(repr((source, headers_digest(source, dirs), defines, tuple(options),
                                arch, nvrtc_version())).encode()).hexdigest()[:24]


def compile_cuda(source: str, *, arch: str, defines: dict | None = None, name="kernel.cu",
                 options: tuple[str, ...] = ()) -> Compiled:
    """Compile CUDA C++ to a cubin for `arch` ('sm_80', 'sm_90a', ...), with an on-disk cache
    (cache_key says what the key covers: nested local headers included)."""
    from cuda.core import Program, ProgramOptions

    defines = dict(sorted((defines or {}).items()))
    key = cache_key(source, arch=arch, defines=defines, options=tuple(options))
    cubin_path = cache_dir() / f"{key}.cubin"
    log_path = cubin_path.with_suffix(".log")
    cached_log = _cached_log(key)
    if cached_log is not None:
        return Compiled(cubin_path.read_bytes(), cached_log, arch, key, cubin_path)
    started = _compiling(name, arch, defines)
    opts = ProgramOptions(
        name=name, arch=arch, std="c++17", include_path=include_path(),
        define_macro=[(k, str(v)) for k, v in defines.items()] or None,
        ptxas_options=["-v", *options], lineinfo=True)
    for _ in range(2):
        log = io.StringIO()
        try:
            obj = Program(source, "c++", opts).compile("cubin", logs=log)
        except Exception as e:
            raise RuntimeError(f"NVRTC failed to compile {name} for {arch}:\n{log.getvalue()}\n{e}")
        text = log.getvalue().replace("\x00", "")
        # On the H100 machine NVRTC has now and then handed back a good cubin with an empty log
        # (under pytest-xdist: sessions 31 and 37), which leaves ptxas's report of registers and
        # spills unread. Once more, then take what came.
        if "Compiling entry function" in text:
            break
    # Both files through a rename, so that a concurrent reader (pytest-xdist workers compiling
    # the same kernel) never sees half a cubin or a log another writer has just truncated; named
    # per process and thread (tests/conftest.py compiles ahead on a second thread).
    me = f"{os.getpid()}-{threading.get_ident()}"
    tmp_log = log_path.with_suffix(f".logtmp{me}")
    tmp_log.write_text(text)
    tmp_log.replace(log_path)
    tmp = cubin_path.with_suffix(f".tmp{me}")
    tmp.write_bytes(obj.code)
    tmp.replace(cubin_path)  # atomic: a concurrent reader never sees half a cubin
    with _count_lock:
        COMPILES["seconds"] += time.perf_counter() - started
    return Compiled(obj.code, text, arch, key, cubin_path)


def _cached_log(key: str) -> str | None:
    """The ptxas log of a cubin the disk cache holds under `key`, or None when compile_cuda
    would compile it. A log without ptxas's report (seen once on the H100 under pytest-xdist:
    an empty log beside a good cubin) would hide registers and spills: that one is compiled
    again."""
    cubin_path = cache_dir() / f"{key}.cubin"
    log_path = cubin_path.with_suffix(".log")
    if cubin_path.exists() and log_path.exists():
        text = log_path.read_text()
        if "Compiling entry function" in text:
            return text
    return None


# A build the cache lacks costs 0.3-9 s of NVRTC and ptxas (one CPU core), and a first run of
# the tests or notebooks compiles a hundred or more: say so, once per build, so that a slow
# first run is not a silent one. The line goes to stderr when that is a terminal
# (FA_COMPILE_PROGRESS=1 forces it, 0 silences it): not in a notebook, whose stderr would differ
# between a first and a later run. COMPILES counts this process's builds (tests/conftest.py
# reports them).
# compile_many silences the line while it runs (it prints one line for all of its builds).
COMPILES = {"count": 0, "seconds": 0.0}
_quiet = threading.Event()
_count_lock = threading.Lock()


def _compiling(name: str, arch: str, defines: dict) -> float:
    with _count_lock:  # compile_many's threads count too
        COMPILES["count"] += 1
    flag = os.environ.get("FA_COMPILE_PROGRESS", "")
    if not _quiet.is_set() and (flag == "1" or (flag != "0" and sys.stderr.isatty())):
        what = ", ".join(f"{k}={v}" for k, v in defines.items() if k in ("HEAD_DIM", "ELEM_BF16"))
        print(f"compiling {name} for {arch}{f' ({what})' if what else ''}: build "
              f"{COMPILES['count']} this run, not in the kernel cache {cache_dir()}…",
              file=sys.stderr, flush=True)
    return time.perf_counter()


_PTXAS_FUNC = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PTXAS_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                          r"(\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas_log(log: str) -> dict:
    """{kernel: {registers, stack_bytes, spill_stores, spill_loads, static_smem_bytes}}."""
    out, current = {}, None
    for line in log.splitlines():
        if m := _PTXAS_FUNC.search(line):
            current = out.setdefault(m.group(1), {"registers": 0, "stack_bytes": 0,
                                                  "spill_stores": 0, "spill_loads": 0,
                                                  "static_smem_bytes": 0})
        elif current is not None:
            if m := _PTXAS_STACK.search(line):
                current.update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)),
                               spill_loads=int(m.group(3)))
            if m := _PTXAS_REGS.search(line):
                current["registers"] = int(m.group(1))
            if m := _PTXAS_SMEM.search(line):
                current["static_smem_bytes"] = int(m.group(1))
    return out


# --------------------------------------------------------------------------------------------
# running (GPU only)

_thread = threading.local()  # per thread: the cuda.core Device whose context is bound there


def _device():
    """The current torch device as cuda.core's Device, with its primary context (the one torch
    uses) bound on the calling thread. A context is current per thread, and the driver API
    calls below need one: PyTorch's autograd engine runs backward on a thread of its own, where
    nothing may have bound a context yet (CUDA_ERROR_INVALID_CONTEXT at the first launch). So
    every thread binds it once, here, before its first load or launch; after that the check is
    one attribute read."""
    dev = getattr(_thread, "device", None)
    if dev is None:
        from cuda.core import Device
        dev = Device(torch.cuda.current_device())  # cuda.core's Device is one per thread
        dev.set_current()
        _thread.device = dev
    return dev


def load_kernel(compiled: Compiled, name: str, *, max_dynamic_smem: int = 0):
    """The kernel `name` (an extern "C" symbol) from a cubin, ready to launch. Kernels that
    use more than 48 KB of dynamic shared memory must ask for it here."""
    require_gpu("loading a kernel")
    from cuda.core import ObjectCode
    _device()
    kernel = ObjectCode.from_cubin(compiled.cubin).get_kernel(name)
    if max_dynamic_smem > 48 * 1024:
        from cuda.bindings import driver
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        (err,) = driver.cuKernelSetAttribute(attr, max_dynamic_smem, kernel.handle,
                                             _device().device_id)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cannot give {name} {max_dynamic_smem} B of shared memory: {err}")
    return kernel


def launch(kernel, grid, block, *args, smem: int = 0):
    """Launch on torch's current stream. Tensors are passed as their device pointers; ints
    and floats must already be numpy scalars of the kernel parameter's type."""
    params = []
    for a in args:
        if isinstance(a, torch.Tensor):
            params.append(a.data_ptr())  # a Python int goes in as 64 bits: a pointer
        elif isinstance(a, (bool, int, float)):
            raise TypeError(f"pass {a!r} as a numpy scalar (np.int32, np.float32): a Python "
                            "number has no C type")
        else:
            params.append(a)
    launch_prepared(kernel, launch_config(grid, block, smem), params)


# The per-call path costs host time that a model making many small attention calls waits on
# (SDPA's own is about 20 µs), so everything that does not change from call to call is made
# once: the cuda.core stream wrapper of each torch stream, the LaunchConfig of each (grid,
# block, shared memory), and (launch_fused) the whole plan of a call for each input layout.
_streams: dict = {}
_configs: dict = {}


# torch's own C entry points for the current stream's raw handle and the current device: one C
# call each, where torch.cuda.current_stream() goes through device-index parsing and a lazy-init
# check (about 10 µs a launch on the H200, measured by experiments/train_step_host). Absent from
# CPU builds of torch, which never launch.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current_device = getattr(torch._C, "_cuda_getDevice", None)


class _StreamHandle:
    """A raw cudaStream_t in the CUDA stream protocol, for cuda.core's create_stream."""

    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def current_stream():
    """cuda.core's wrapper of torch's current stream (at call time: inside CUDA-graph capture
    that is the capturing stream), made once per stream."""
    if _raw_stream is not None:
        handle = _raw_stream(_current_device())
    else:
        handle = torch.cuda.current_stream().cuda_stream
    stream = _streams.get(handle)
    if stream is None:
        if len(_streams) > 256:  # streams come and go: do not grow without bound
            _streams.clear()
        stream = _streams[handle] = _device().create_stream(_StreamHandle(handle))
    return stream


def launch_config(grid, block, smem: int = 0, *, pdl: bool = False, cluster: int = 1):
    """cuda.core's LaunchConfig, made once per (grid, block, shared memory, pdl, cluster). pdl:
    launched with programmatic dependent launch (sm_90+; cuda.core ≥ 1.2), so that the kernel may
    start before the one before it in the stream has finished: it must wait for that one itself
    (griddepcontrol.wait) before reading what it wrote. cluster: blocks per thread-block cluster
    along x (sm_90+), consecutive blocks forming one; `grid` stays in blocks (a multiple of it)."""
    key = (grid, block, smem, pdl, cluster)
    config = _configs.get(key)
    if config is None:
        from cuda.core import LaunchConfig
        if len(_configs) > 4096:
            _configs.clear()
        extra = {"programmatic_stream_serialization": True} if pdl else {}
        if cluster > 1:
            if grid[0] % cluster:
                raise ValueError(f"a grid of {grid[0]} blocks is not a whole number of {cluster}-block clusters")
            # cuda.core (1.x) takes the grid in clusters when a cluster is given
            grid, extra["cluster"] = (grid[0] // cluster, *grid[1:]), (cluster, 1, 1)
        config = _configs[key] = LaunchConfig(grid=grid, block=block, shmem_size=smem, **extra)
    return config


def launch_prepared(kernel, config, params) -> None:
    """Launch with arguments already in kernel form: Python ints for pointers and 64-bit
    integers, numpy scalars for everything else."""
    from cuda.core import launch as cc_launch
    _device()  # this thread's context bound (autograd's backward thread may have none)
    cc_launch(current_stream(), config, kernel, *params)


# --------------------------------------------------------------------------------------------
# what every CUDA C++ stage does: one source file, compiled per (element type, head dim)

ELEMENT_DEFINES = {torch.float16: {}, torch.bfloat16: {"ELEM_BF16": 1}}  # see stages/attention.cuh
MAX_GRID_X = 2**31 - 1  # CUDA's limit on gridDim.x
MAX_GRID_YZ = 65535  # ... on gridDim.y and gridDim.z


def compile_stage(source: Path, *, arch: str, dtype=torch.float16, head_dim: int = 64,
                  defines: dict | None = None) -> Compiled:
    """Compile a stage's .cu file for one element type and head dim (both compile-time
    constants of the kernels: HEAD_DIM, and ELEM_BF16 for bfloat16)."""
    return compile_cuda(Path(source).read_text(), arch=arch, name=Path(source).name,
                        defines=stage_defines(dtype, head_dim, defines))


def stage_defines(dtype, head_dim: int, defines: dict | None = None) -> dict:
    """The defines compile_stage compiles a stage's source with."""
    return {**ELEMENT_DEFINES[dtype], "HEAD_DIM": head_dim, **(defines or {})}


@dataclass(frozen=True)
class Build:
    """One compile of a stage's source: what compile_stage takes. lib.bench works out those its
    rows will need (CALL_BUILDS) and compiles them ahead, at once (compile_many)."""

    source: Path
    arch: str
    dtype: torch.dtype
    head_dim: int
    defines: tuple = ()  # (name, value) pairs, as stage_kernels takes them

    def compile(self) -> Compiled:
        return compile_stage(self.source, arch=self.arch, dtype=self.dtype,
                             head_dim=self.head_dim, defines=dict(self.defines))

    def key(self) -> str:
        """compile_cuda's cache key of this build."""
        return cache_key(Path(self.source).read_text(), arch=self.arch,
                         defines=stage_defines(self.dtype, self.head_dim, dict(self.defines)))

    def cached(self) -> bool:
        """Whether compile() would come from the disk cache (nothing compiled)."""
        return _cached_log(self.key()) is not None

    def __str__(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in self.defines)
        return f"{Path(self.source).name} {self.arch} {str(self.dtype)[6:]} D{self.head_dim}{extra}"


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity; all of them off Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def compile_many(builds, workers: int | None = None, alongside=()) -> tuple[int, list]:
    """Compile `builds` (Build objects) into the disk cache, up to `workers` at once (default:
    one per usable core), in threads: NVRTC and ptxas run without holding Python's lock and without
    a lock of their own (measured on a 2-core machine: two threads' compiles of stage 6 ran side
    by side, neither blocked for more than 0.13 s of its 1.2-2 s; the main job's 14 builds took
    7.1 s on two threads against 14.0 s one after another), so no worker process has to start
    and import torch (2 s there). Touches no GPU (cubin output needs no driver). Meanwhile the calling
    thread runs the callables `alongside` (their exceptions ignored). The per-build progress
    line (_compiling) is silenced: the caller says one line for all. Returns (builds compiled,
    [(build, exception)] for those that failed), each failure left for whoever compiles that
    build next to compile again and report."""
    from concurrent.futures import ThreadPoolExecutor

    # Imports and lookups first, on this thread: two threads importing cuda.core at once can
    # see it half made (tests/conftest.py met "cannot import name 'Program'").
    from cuda.core import Program, ProgramOptions  # noqa: F401
    nvrtc_version(), include_dirs(), cache_dir()
    builds = list(dict.fromkeys(builds))
    workers = max(1, min(workers or usable_cores(), len(builds) or 1))
    failed = []
    _quiet.set()
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="compile-ahead") as pool:
            # the longest first, so that no long one starts last: the arch-specific (sm_90a:
            # wgmma) kernels, then the larger head dim (on a 2-core machine stage 6's D128
            # build took 1.5-2 s, stage 4's D64 one 0.6 s)
            order = sorted(builds, key=lambda b: (not b.arch.endswith("a"), -b.head_dim))
            futures = [(b, pool.submit(b.compile)) for b in order]
            for call in alongside:
                try:
                    call()
                except Exception:  # noqa: BLE001 (whoever makes the call next reports it)
                    pass
            for b, f in futures:
                try:
                    f.result()
                except Exception as e:  # noqa: BLE001 (the row compiles it again and reports)
                    failed.append((b, e))
    finally:
        _quiet.clear()
    return len(builds) - len(failed), failed


@lru_cache(maxsize=None)
def stage_kernels(source: Path, names: tuple[str, ...], dtype, head_dim: int,
                  max_dynamic_smem: int = 0, defines: tuple = ()) -> dict:
    """The named kernels of a stage's source, compiled for this GPU and loaded (once per
    process for each element type and head dim)."""
    compiled = compile_stage(source, arch=gpu_arch(), dtype=dtype, head_dim=head_dim,
                             defines=dict(defines))
    return {n: load_kernel(compiled, n, max_dynamic_smem=max_dynamic_smem) for n in names}


# The define of the build whose row strides are the constant D (stages/attention.cuh): what
# contiguous inputs run, and what the stages' compile_for shows offline.
PACKED_ROWS = (("ROWS_PACKED", 1),)


def rows_packed(*tensors) -> bool:
    """Whether every [B, H, S, D] tensor has row stride D (a single row's stride is never used)."""
    return all(t.shape[2] <= 1 or t.stride(2) == t.shape[3] for t in tensors)


def layout_args(t) -> tuple:
    """A tensor's batch, head and row strides (elements) as the kernels take them: 64-bit,
    64-bit, 32-bit (lib.inputs.validate checks that the row stride fits)."""
    sb, sh, ss, _ = t.stride()
    return np.int64(sb), np.int64(sh), np.int32(ss)


class Plan:
    """Everything about one fused launch except the data pointers: made once per input layout."""

    __slots__ = ("info", "kernel", "config", "args", "align", "trivial")

    def __init__(self, info, kernel, config, args, align, trivial):
        self.info, self.kernel, self.config, self.args = info, kernel, config, args
        self.align, self.trivial = align, trivial  # pointer alignment to check; nothing to run


_plans: dict = {}


def launch_fused(info, source: Path, q, k, v, *, causal, scale, block_q: int, threads: int,
                 smem: int = 0, defines: tuple = (), varlen=None, lse=None):
    """What the launcher of every fused stage (2 and up) does: validate the inputs, then run
    the stage's kernel `attention_fused` on a 1-D grid of (query tiles of block_q rows) ×
    (batch·heads) with `threads` threads and `smem` bytes of dynamic shared memory. The
    kernel's parameters are (q, k, v, out, Sq, Sk, scale·log2(e), causal, H, group) and the
    batch, head and row strides of q, k and v (stages/attention.cuh); `causal` is False, True
    or an alignment name (lib.inputs.causal_mode: the kernel gets 0, 1 or 2). A stage with
    packed sequences (INFO.varlen) takes two more, the offsets cu_q and cu_k (null for a
    [B, H, S, D] call); `varlen` is then a validated lib.inputs.Varlen, whose views q, k, v
    are, and whose output is [total_q, H, D]. A stage whose kernel saves the log-sum-exp
    (INFO.saves_lse) takes its pointer last: `lse`, a float32 [B, H, Sq] tensor, or null.

    A call whose shapes, strides, dtypes, device, causal and scale were seen before reuses
    that call's plan (validation included): only the pointers' alignment is checked again."""
    try:  # reading attributes a non-tensor lacks: the full validation below says what is wrong
        key = (id(info), source, block_q, threads, smem, defines, q.shape, q.stride(),
               q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device, v.shape, v.stride(),
               v.dtype, v.device, causal, type(causal), scale, type(scale),
               varlen and (varlen.n_seqs, varlen.max_q, varlen.max_k, varlen.causal))
        plan = _plans.get(key)
    except Exception:
        key, plan = None, None
    if plan is not None and (plan.info is not info or (
            plan.align and (q.data_ptr() | k.data_ptr() | v.data_ptr()) % plan.align)):
        plan = None  # another stage's (id reused), or a misaligned pointer: validate() explains
    if plan is not None:
        refuse_grad(info, q, k, v)  # a plan made without grad says nothing about this call
    if plan is None:
        plan = _make_plan(info, source, q, k, v, causal=causal, scale=scale, block_q=block_q,
                          threads=threads, smem=smem, defines=defines, varlen=varlen)
        if key is not None:
            if len(_plans) > 4096:
                _plans.clear()
            _plans[key] = plan
    if varlen is not None:
        out = new_output(q[0].transpose(0, 1))  # [total_q, H, D]
        if plan.trivial:
            return out.zero_()  # no query rows, or no keys anywhere: zeros, as SDPA gives
        cu = (varlen.cu_q.data_ptr(), varlen.cu_k.data_ptr())
    else:
        if plan.trivial:
            if lse is not None:
                lse.fill_(-math.inf)  # no key: the log of an empty sum
            return trivial_output(q, k)
        out = new_output(q)
        cu = (0, 0) if info.varlen else ()
    if info.saves_lse:
        cu = (*cu, 0 if lse is None else lse.data_ptr())
    launch_prepared(plan.kernel, plan.config,
                    (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), *plan.args, *cu))
    return out


def _make_plan(info, source, q, k, v, *, causal, scale, block_q, threads, smem, defines,
               varlen=None) -> Plan:
    if varlen is None:
        scale = validate(q, k, v, causal=causal, scale=scale, info=info)
        B, H, Sq, D = q.shape
        Hk, Sk = k.shape[1], k.shape[2]
        causal = causal_mode(causal, Sq, Sk, info)
    else:  # validated by lib.inputs.validate_varlen; the grid covers the longest sequence
        scale, causal = varlen.scale, varlen.causal
        B, H, Sq, D = varlen.n_seqs, q.shape[1], varlen.max_q, q.shape[3]
        Hk, Sk = k.shape[1], varlen.max_k
    n_blocks = (Sq + block_q - 1) // block_q * B * H
    align = info.align_bytes if info.align_bytes > q.element_size() else 0
    if n_blocks == 0 or Sk == 0:
        return Plan(info, None, None, (), align, trivial=True)
    check_grid_x(f"stage {info.number}", n_blocks)
    defines = fused_defines(defines, packed=rows_packed(q, k, v), varlen=varlen is not None)
    kern = stage_kernels(source, ("attention_fused",), q.dtype, D, max_dynamic_smem=smem,
                         defines=defines)["attention_fused"]
    args = (np.int32(Sq), np.int32(Sk), np.float32(scale * math.log2(math.e)), np.int32(causal),
            np.int32(H), np.int32(H // Hk), *layout_args(q), *layout_args(k), *layout_args(v))
    if varlen is not None:  # b counts sequences, found through the offsets: no batch stride
        args = args[:6] + tuple(np.int64(0) if i % 3 == 0 else x for i, x in enumerate(args[6:]))
    return Plan(info, kern, launch_config((n_blocks, 1, 1), (threads, 1, 1), smem), args, align,
                trivial=False)


def fused_defines(defines: tuple, *, packed: bool, varlen: bool = False) -> tuple:
    """The defines launch_fused compiles a stage's kernel with: the stage's own, then the
    build with constant row strides (stages/attention.cuh) when every row stride is D
    (rows_packed), and the build that finds each sequence through the offsets (varlen)."""
    return tuple(defines) + (PACKED_ROWS if packed else ()) + ((("VARLEN", 1),) if varlen else ())


def check_grid_x(what: str, n_blocks: int) -> None:
    """gridDim.x holds up to 2^31 − 1 blocks: say so instead of failing to launch."""
    if n_blocks > MAX_GRID_X:
        raise NotImplementedError(f"{what}: {n_blocks:,} blocks exceed CUDA's grid limit of "
                                  f"{MAX_GRID_X:,} in x (too many batch·heads × query tiles)")


def check_grid(what: str, **dims: int) -> None:
    """Grid dimensions y and z are limited to 65535 blocks: say so instead of failing to launch."""
    for name, n in dims.items():
        if n > MAX_GRID_YZ:
            raise NotImplementedError(f"{what}: {name} = {n} exceeds CUDA's grid limit of "
                                      f"{MAX_GRID_YZ} blocks in that dimension")
