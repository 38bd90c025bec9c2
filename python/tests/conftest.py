"""Shared by the Python tests: the CUDA condition GPU tests skip on (with the reason), seeds."""

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
requires_cuda = pytest.mark.skipif(CUDA_SKIP_REASON is not None, reason=CUDA_SKIP_REASON or "")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
