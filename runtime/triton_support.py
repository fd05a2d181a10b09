"""Where the runtime's Triton kernels run: CUDA devices, and CPU tensors under Triton's interpreter
(TRITON_INTERPRET=1, set before Triton is imported; the tests use it to check the kernels without a GPU).
`triton` is None where Triton is not installed (CPU-only installs): the callers then use PyTorch."""
from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None
    tl = None


def use_triton(device: torch.device) -> bool:
    if triton is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
