"""How ELMo computes on CPUs: two choices, both on by default and both exact, set for a scope.

    with hf_elmo.cpu_backend(onednn=False, concurrent_inference=False):
        model(**batch)

* `onednn`: large float32 and bfloat16 matrix products through oneDNN (`onednn_linear.py`).
* `concurrent_inference`: the independent parts of an inference pass side by side on threads (`cpu_threads.py`).

A choice holds in the calling thread (and asyncio task) and in the threads it hands parts of a pass to: it lives in
a `contextvars` context, so other threads and tasks keep theirs.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class CpuBackend:
    onednn: bool = True
    concurrent_inference: bool = True


_CURRENT: ContextVar[CpuBackend] = ContextVar("hf_elmo_cpu_backend", default=CpuBackend())


def current_cpu_backend() -> CpuBackend:
    """The choices in effect here."""
    return _CURRENT.get()


@contextmanager
def cpu_backend(**choices: bool) -> Iterator[CpuBackend]:
    """Makes the given choices (fields of `CpuBackend`) for the `with` block; the others stay as they are."""
    token = _CURRENT.set(replace(_CURRENT.get(), **choices))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)


__all__ = ["CpuBackend", "cpu_backend", "current_cpu_backend"]
