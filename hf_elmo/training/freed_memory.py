"""Keeping the memory a training step frees in the process, so that the next step reuses its pages.

Every training step allocates and frees the same large tensors: input products, the activations saved for the
backward pass, gradients. glibc's `malloc` hands blocks above its mmap threshold back to the system when they are
freed (the threshold starts at 128 KiB and follows the largest block freed, up to 32 MiB, so a block of the same
size as the last one is mapped anew) and returns the top of its heap once more than twice that is free. The next
step's tensors then land on fresh pages, and each 4 KiB page faults when first written: time spent inside
whichever operation first writes a new tensor, tens of thousands of faults per step of a large model.

`keep_freed_memory()` raises both thresholds (blocks of up to 256 MiB come from the heap, which is trimmed only
beyond 1 GiB free), after which few faults remain per step. The process holds on to the memory of its busiest step
instead of giving it back between steps, and its heap fragments a little (docs/performance.md has the measured
effect). That suits a process that trains batch after batch.
`train_bilm` (`hf-elmo train`) calls it unless told not to (`keep_freed_memory=False`); a training script of one's
own can call it once at its start. It changes `malloc` for the whole process and is a no-op where the C library is
not glibc.
"""

import ctypes
import functools

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 256 << 20
TRIM_THRESHOLD = 1 << 30


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        process = ctypes.CDLL(None)
    except (OSError, TypeError):  # TypeError: Windows cannot open the process itself
        return None
    # Only glibc has gnu_get_libc_version, and only glibc's mallopt takes these parameters.
    if not (hasattr(process, "gnu_get_libc_version") and hasattr(process, "mallopt")):
        return None
    process.mallopt.argtypes, process.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return process


def keep_freed_memory() -> bool:
    """Makes `malloc` keep freed blocks of up to 256 MiB in the process for reuse; whether it could (glibc)."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) & bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


__all__ = ["keep_freed_memory"]
