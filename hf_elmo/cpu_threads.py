"""Independent parts of a CPU inference pass, run side by side on threads.

The two directions of every LSTM layer are independent, and so are the words of the character CNN. Giving each part its
own thread with its share of the intra-op threads replaces thousands of small multi-threaded operations, each ending in
a barrier where one descheduled thread stalls the others, by a few single-threaded streams: as fast on an idle machine
and many times faster on a busy one (docs/performance.md). Used only without autograd (a backward pass runs on the
autograd engine's thread), only on CPU, and only where `paths.threads` is "concurrent" (the default on CPUs). The
callers send fewer of the workers' matrix products to oneDNN (`OnednnProducts.beside_other_threads`): PyTorch's own
kernels release the GIL while they run. (Training does not split: each LSTM step is a dozen small operations whose
Python dispatch holds the GIL, and one thread running both directions stacked, `lstm_sorted.py`, is faster than two
threads waiting for each other.)

A worker gets its share of threads without `torch.set_num_threads`: that also sets ATen's process-wide count,
which every thread that starts using torch afterwards begins with, so a thread of the application started
meanwhile would get a worker's share. The workers set only their own OpenMP and MKL counts, through the libraries
PyTorch runs on; where those cannot be found (builds without OpenMP, systems without `/proc/self/maps`), the
parts run one after the other.
"""

import contextvars
import ctypes
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

_executors: dict[int, ThreadPoolExecutor] = {}
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_executors.clear)  # a forked child has none of the parent's threads


@functools.cache
def _thread_count_setters() -> tuple[Callable[[int], int], ...] | None:
    """Functions setting the calling thread's OpenMP (and MKL) thread count, or `None` where they are not found."""
    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        libraries = {Path(line.split()[-1]) for line in Path("/proc/self/maps").read_text().splitlines() if "/" in line}
        candidates = [path for path in libraries if path.name.startswith(("libgomp", "libiomp5", "libomp"))]
        # Other packages can load OpenMP libraries of their own: PyTorch's is the one in its folder, if it has one.
        torch_folder = Path(torch.__file__).resolve().parent
        openmp = min(candidates, key=lambda path: torch_folder not in path.resolve().parents)
        setters = [ctypes.CDLL(str(openmp)).omp_set_num_threads]
        # PyTorch's x86 builds link MKL statically into libtorch_cpu; its thread-local setting is this one.
        torch_cpu = next((path for path in libraries if path.name.startswith("libtorch_cpu")), None)
        mkl = getattr(ctypes.CDLL(str(torch_cpu)), "MKL_Set_Num_Threads_Local", None) if torch_cpu else None
    except (OSError, StopIteration, AttributeError):
        return None
    except ValueError:  # no OpenMP library among them
        return None
    if mkl is not None:
        setters.append(mkl)
    for setter in setters:
        setter.argtypes, setter.restype = [ctypes.c_int], ctypes.c_int
    return tuple(setters) if _sets_torch_threads(setters) else None


def _sets_torch_threads(setters) -> bool:
    """Whether `setters`, called in a new thread, change what PyTorch uses there (not some other OpenMP's count)."""
    target = 1 if torch.get_num_threads() != 1 else 2

    def check():
        torch.get_num_threads()
        for setter in setters:
            setter(target)
        return torch.get_num_threads() == target

    with ThreadPoolExecutor(1) as executor:
        return executor.submit(check).result()


def can_run_concurrently(tensor: torch.Tensor, threads: str) -> bool:
    """Whether work on `tensor` may be split between threads, on `paths.threads` `threads`."""
    return (
        threads == "concurrent"
        and tensor.device.type == "cpu"
        and not torch.is_grad_enabled()
        and torch.get_num_threads() > 1
        and _thread_count_setters() is not None
    )


def run_concurrently(*calls: Callable):
    """Runs zero-argument callables on one thread each, with an equal share of the caller's intra-op threads and
    its inference-mode, autocast and `contextvars` state. Returns their results in order."""
    share = max(1, torch.get_num_threads() // len(calls))
    inference_mode = torch.is_inference_mode_enabled()
    autocast = {
        "device_type": "cpu",
        "dtype": torch.get_autocast_dtype("cpu"),
        "enabled": torch.is_autocast_enabled("cpu"),
    }

    def run(call):
        torch.get_num_threads()  # ATen sets a thread's counts to its process-wide one on first use: before ours
        for set_num_threads in _thread_count_setters():
            set_num_threads(share)
        with torch.inference_mode(inference_mode), torch.no_grad(), torch.autocast(**autocast):
            return call()

    executor = _executors.get(len(calls))
    if executor is None:
        executor = _executors[len(calls)] = ThreadPoolExecutor(len(calls), thread_name_prefix="hf-elmo")
    futures = [executor.submit(contextvars.copy_context().run, run, call) for call in calls]
    return [future.result() for future in futures]
