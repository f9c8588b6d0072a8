"""Plain `pytest` picks the mode itself: real kernels on a GPU, numba's simulator and offline
compilation without one (tiny shapes, fast)."""
import random

import pytest

import lib  # noqa: F401  (decides the mode before numba is imported)
from lib.simulator import HAS_GPU

gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
cpu_only = pytest.mark.skipif(HAS_GPU, reason="CPU-mode behaviour")


def pytest_report_header(config):
    from lib.simulator import banner
    return banner()


@pytest.fixture
def seed():
    """A fresh seed per test, printed on failure so a case can be replayed."""
    return random.SystemRandom().randrange(2**31)
