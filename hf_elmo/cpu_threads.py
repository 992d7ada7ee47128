"""Independent parts of a CPU pass, run side by side on threads.

The two directions of every LSTM layer are independent, and so are the words of the character CNN. Giving each
part its own thread with its share of the intra-op threads replaces thousands of small multi-threaded
operations, each ending in a barrier where one descheduled thread stalls the others, by a few single-threaded
streams: as fast on an idle machine and many times faster on a busy one (on 2 shared cores: 0.47 s instead of
4.8 s for a batch of the original model). At inference both are split; in training the LSTM directions are, in
the forward and in the backward pass, because a layer's two directions are one autograd node (`fast_lstm.py`)
whose backward splits them itself (the autograd engine runs all CPU nodes on one thread). Only on CPU; set
`CONCURRENT_CPU_INFERENCE = False` or `CONCURRENT_CPU_TRAINING = False` to turn either off.
"""

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

CONCURRENT_CPU_INFERENCE = True
"""Run independent parts of a CPU inference pass on separate threads (module-level switch)."""
CONCURRENT_CPU_TRAINING = True
"""Run the two directions of each LSTM layer on separate threads under autograd too (module-level switch)."""

_executors: dict[int, ThreadPoolExecutor] = {}
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_executors.clear)  # a forked child has none of the parent's threads


def can_run_concurrently(tensor: torch.Tensor, training: bool = False) -> bool:
    """Whether work on `tensor` may be split between threads: without autograd, or with `training` for work that
    handles its own backward."""
    return (
        (CONCURRENT_CPU_TRAINING if training else CONCURRENT_CPU_INFERENCE and not torch.is_grad_enabled())
        and tensor.device.type == "cpu"
        and torch.get_num_threads() > 1
    )


def run_concurrently(*calls: Callable):
    """Runs zero-argument callables on one thread each, with an equal share of the caller's intra-op threads and
    its inference-mode and autocast state. Returns their results in order."""
    threads = torch.get_num_threads()
    share = max(1, threads // len(calls))
    inference_mode = torch.is_inference_mode_enabled()
    autocast = {
        "device_type": "cpu",
        "dtype": torch.get_autocast_dtype("cpu"),
        "enabled": torch.is_autocast_enabled("cpu"),
    }

    def run(call):
        torch.set_num_threads(share)
        with torch.inference_mode(inference_mode), torch.no_grad(), torch.autocast(**autocast):
            return call()

    executor = _executors.get(len(calls))
    if executor is None:
        executor = _executors[len(calls)] = ThreadPoolExecutor(len(calls), thread_name_prefix="hf-elmo")
    try:
        futures = [executor.submit(run, call) for call in calls]
        return [future.result() for future in futures]
    finally:
        # The count is also the default of threads that start later: give them the caller's again.
        torch.set_num_threads(threads)
