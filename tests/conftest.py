import os

import pytest
import torch

import kbit


def _gpu_ready() -> bool:
    if not torch.cuda.is_available():
        return False
    if not kbit.native_available() and os.environ.get("KBIT_ALLOW_NO_NATIVE") != "1":
        # A GPU without the native library is a broken install: fail loudly, do not skip.
        raise RuntimeError(f"a CUDA GPU is visible but {kbit.native_status()}")
    return kbit.native_available()


GPU = _gpu_ready()
gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU and the kbit native library")


@pytest.fixture
def rng():
    """A fresh generator per test, seeded from the OS: inputs differ on every run."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"rng seed = {seed}")  # shown with a failure's captured output, to reproduce it
    return torch.Generator().manual_seed(seed)


def random_weight(n, k, dtype=torch.float32, gen=None, device="cpu", spread=2.0):
    """Gaussian weights whose row scales vary over `spread` decades (exercises many absmax)."""
    w = torch.randn(n, k, generator=gen, dtype=torch.float64)
    scale = 10.0 ** (-spread * torch.rand(n, 1, generator=gen, dtype=torch.float64))
    return (w * scale * 0.5).to(dtype).to(device)
