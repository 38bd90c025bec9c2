"""Shared by the Python tests: the CUDA condition GPU tests skip on (with the reason), the `cuda`
marker that selects them (python/tests/gpu_step.py runs `-m cuda` on the GPU machine), seeds."""

import pytest
import torch

import mxmoe


def _cuda_reason() -> str | None:
    why = mxmoe.cuda.why_unavailable()
    if why is not None:
        return f"mxmoe's CUDA backend is unavailable: {why}"
    if not torch.cuda.is_available():
        return "torch has no usable CUDA device"
    return None


CUDA_SKIP_REASON = _cuda_reason()
# A test (or a parameter: pytest.param("cuda", marks=CUDA_MARKS)) marked `cuda`, skipped with the
# reason where the CUDA backend cannot run.
CUDA_MARKS = (pytest.mark.cuda, pytest.mark.skipif(CUDA_SKIP_REASON is not None, reason=CUDA_SKIP_REASON or ""))


def requires_cuda(test):
    """Marks a test `cuda` and skips it, with the reason, where the CUDA backend cannot run."""
    for mark in CUDA_MARKS:
        test = mark(test)
    return test


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs mxmoe's CUDA backend and a GPU (skipped with the reason otherwise)")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
