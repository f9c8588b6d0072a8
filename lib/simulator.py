"""Which mode this machine runs in, and the warp functions numba's simulator lacks.

With a CUDA GPU, kernels run for real. Without one, numba stages run in numba's CUDA
simulator (NUMBA_ENABLE_CUDASIM=1, switched on here before numba.cuda is imported) on CPU
tensors at tiny shapes, and CUDA C++ stages are compiled offline and inspected, not run.

numba's simulator runs each thread of a block as a Python thread but has no warp-level
functions. `install_warp_shim` adds them (shfl_sync, shfl_up/down/xor_sync, ballot_sync,
activemask, syncwarp, all_sync, any_sync, lanemask_lt): the 32 lanes of a warp meet at a
barrier, publish their values, read the lane they asked for, and meet again before anyone
may publish the next value.
"""
from __future__ import annotations

import os
import threading

import torch

HAS_GPU = torch.cuda.is_available()
SIMULATOR = not HAS_GPU
if SIMULATOR:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
# The GPU warns on stderr about small grids where the simulator does not; notebooks and
# tests compare output, so keep both quiet.
os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")

WARP_TIMEOUT_S = 120.0  # a lane that never arrives is a kernel bug: fail instead of hanging


class GPURequiredError(RuntimeError):
    """This step runs kernels for real and there is no GPU here."""


def mode() -> str:
    return "gpu" if HAS_GPU else "simulator"


def banner() -> str:
    """One line saying how this process runs the curriculum."""
    if HAS_GPU:
        p = torch.cuda.get_device_properties(0)
        return (f"GPU mode: {p.name}, compute capability {p.major}.{p.minor}, "
                f"{p.multi_processor_count} SMs, torch {torch.__version__}: kernels run for real.")
    return ("CPU mode (no GPU found): numba stages run in numba's CUDA simulator at tiny shapes, "
            "CUDA C++ stages are compiled offline and inspected; performance figures come from "
            "the recorded results file.")


def require_gpu(what: str, stage: int | None = None) -> None:
    """Raise GPURequiredError unless this machine has a CUDA GPU; for a stage, point at the
    offline inspection of that stage."""
    if not HAS_GPU:
        inspect = f"lib.sass.inspect_stage({stage if stage is not None else 'n'})"
        raise GPURequiredError(
            f"{what} needs a CUDA GPU and none was found. Without one you can still compile it "
            f"and read its registers, shared memory and SASS: {inspect}, as the stage's "
            "notebook does.")


def check_numba_mode() -> None:
    """numba decides simulator-or-not when numba.cuda is first imported; make sure that
    happened after this module set the switch."""
    from numba import config
    if os.environ.get("FA_NUMBA_COMPILE_ONLY") == "1":  # lib.sass compiling without a GPU
        return
    if bool(config.ENABLE_CUDASIM) != SIMULATOR:
        raise RuntimeError(
            f"numba.cuda was imported before lib decided the mode (simulator={SIMULATOR}, "
            f"numba's NUMBA_ENABLE_CUDASIM={config.ENABLE_CUDASIM}): import lib before numba, "
            "or set NUMBA_ENABLE_CUDASIM yourself.")


# --------------------------------------------------------------------------------------------
# the warp shim

class _WarpGroup:
    """The lanes of one warp taking part in one collective (one mask)."""

    def __init__(self, parties: int):
        self.barrier = threading.Barrier(parties)
        self.values: dict[int, object] = {}


_shim_lock = threading.Lock()


def _lane_and_warp():
    t = threading.current_thread()
    return t.thread_id % 32, t.thread_id // 32, t


def _exchange(mask: int, value):
    """Publish `value` for this lane; return (lane, {lane: value} of every lane in mask)."""
    lane, warp, t = _lane_and_warp()
    manager = t._manager
    bx, by, bz = manager._block_dim
    n_threads = bx * by * bz
    existing = 0
    for ln in range(32):  # lanes that exist in this warp (the last warp may be partial)
        if warp * 32 + ln < n_threads:
            existing |= 1 << ln
    mask = int(mask) & existing
    if not (mask >> lane) & 1:
        raise RuntimeError(f"lane {lane} of warp {warp} called a *_sync warp function with "
                           f"mask {mask:#010x}, which does not include it")
    with _shim_lock:
        groups = manager.__dict__.setdefault("_warp_groups", {})
        group = groups.get((warp, mask))
        if group is None:
            group = groups[(warp, mask)] = _WarpGroup(bin(mask).count("1"))
    try:
        group.values[lane] = value
        group.barrier.wait(WARP_TIMEOUT_S)
        snapshot = dict(group.values)
        group.barrier.wait(WARP_TIMEOUT_S)  # nobody publishes again before all have read
    except threading.BrokenBarrierError:
        raise RuntimeError(
            f"warp {warp}: not every lane in mask {mask:#010x} reached the warp function within "
            f"{WARP_TIMEOUT_S:.0f} s (lanes that exited or diverged?)") from None
    return lane, snapshot


def _read(snapshot, src, own):
    return snapshot[src] if 0 <= src < 32 and src in snapshot else own


def shfl_sync(self, mask, value, src_lane):
    lane, snap = _exchange(mask, value)
    return _read(snap, int(src_lane) % 32, value)


def shfl_up_sync(self, mask, value, delta):
    lane, snap = _exchange(mask, value)
    return _read(snap, lane - int(delta), value)


def shfl_down_sync(self, mask, value, delta):
    lane, snap = _exchange(mask, value)
    return _read(snap, lane + int(delta), value)


def shfl_xor_sync(self, mask, value, lane_mask):
    lane, snap = _exchange(mask, value)
    return _read(snap, lane ^ int(lane_mask), value)


def ballot_sync(self, mask, predicate):
    _, snap = _exchange(mask, bool(predicate))
    return sum(1 << ln for ln, p in snap.items() if p)


def all_sync(self, mask, predicate):
    _, snap = _exchange(mask, bool(predicate))
    return int(all(snap.values()))


def any_sync(self, mask, predicate):
    _, snap = _exchange(mask, bool(predicate))
    return int(any(snap.values()))


def syncwarp(self, mask=0xFFFFFFFF):
    _exchange(mask, None)


def activemask(self):
    lane, warp, t = _lane_and_warp()
    bx, by, bz = t._manager._block_dim
    n = min(32, bx * by * bz - warp * 32)
    return (1 << n) - 1


def lanemask_lt(self):
    lane, _, _ = _lane_and_warp()
    return (1 << lane) - 1


WARP_FUNCTIONS = {f.__name__: f for f in (shfl_sync, shfl_up_sync, shfl_down_sync, shfl_xor_sync,
                                          ballot_sync, all_sync, any_sync, syncwarp, activemask,
                                          lanemask_lt)}


def install_warp_shim() -> None:
    """Give numba's simulator the warp functions (idempotent; simulator mode only)."""
    from numba.cuda.simulator.kernelapi import FakeCUDAModule
    for name, fn in WARP_FUNCTIONS.items():
        setattr(FakeCUDAModule, name, fn)


def numba_cuda():
    """numba.cuda, imported in the mode this machine needs (with the shim on the simulator)."""
    from numba import cuda
    check_numba_mode()
    if config_simulator():
        install_warp_shim()
    return cuda


def config_simulator() -> bool:
    from numba import config
    return bool(config.ENABLE_CUDASIM)
