"""The one shared harness of the curriculum: reference and error rule, and the backward's
reference (reference), FP8 scaling and its emulated error (fp8), inputs and validation (inputs), timing (timing), NVRTC compile and launch (nvrtc), offline inspection
(sass), simulator mode and warp shim (simulator), recorded results (results), plots (plots),
the main job (bench) and notebook helpers (notebook).

Importing lib decides the mode first: with no GPU, numba's CUDA simulator is switched on
before anything imports numba.cuda.
"""
import sys as _sys

# Deciding the mode imports torch (seconds); a process that only prints its usage
# (`python -m lib.bench --help`) runs nothing that needs it. Every numba import goes through
# lib.simulator anyway, so the mode is still decided before numba.cuda in any later import.
if not {"-h", "--help"} & set(_sys.argv[1:]):
    from lib import simulator  # noqa: F401  (must run before numba.cuda is imported)
