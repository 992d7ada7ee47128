"""Triton where it is installed (it comes with PyTorch's CUDA builds), and whether its kernels run on CPU tensors
under its interpreter: `TRITON_INTERPRET=1` set before Triton is first imported, as the CPU test suite does. The one
place the package asks; the kernel modules (`char_cnn_triton`, `lstm_triton`, `sampled_softmax_triton`) and
`adagrad` import from here."""

import os

try:  # inside `try`: transformers' check of a saved folder's imports then does not require Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installation
    triton = tl = None

INTERPRETED = triton is not None and os.environ.get("TRITON_INTERPRET") == "1"
"""Whether kernels are defined for Triton's interpreter (they then run on CPU tensors only)."""


def require_triton(module: str):
    """Raises ImportError in a kernel module when Triton is missing: its importers then use PyTorch operations."""
    if triton is None:
        raise ImportError(f"{module} needs Triton, which is not installed")
