"""The one shared harness of the curriculum: reference and error rule (reference), inputs and
validation (inputs), timing (timing), NVRTC compile and launch (nvrtc), offline inspection
(sass), simulator mode and warp shim (simulator), recorded results (results), plots (plots),
the main job (bench) and notebook helpers (notebook).

Importing lib decides the mode first: with no GPU, numba's CUDA simulator is switched on
before anything imports numba.cuda.
"""
from lib import simulator  # noqa: F401  (must run before numba.cuda is imported)
