"""The CPU choices of the pass running in this context: oneDNN products (`paths.linear`) and concurrent inference
(`paths.threads`). `ElmoModel` sets them from its resolved paths for each pass; `onednn_linear` and `cpu_threads`,
which lie below the model, read them here. They live in a `contextvars` context: the threads a pass hands parts to
inherit them, other threads and asyncio tasks keep theirs. Outside a pass both are on.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class CpuBackend:
    onednn: bool = True
    concurrent_inference: bool = True


_CURRENT: ContextVar[CpuBackend] = ContextVar("hf_elmo_cpu_backend", default=CpuBackend())  # noqa: B039 (frozen)


def current_cpu_backend() -> CpuBackend:
    """The choices in effect here."""
    return _CURRENT.get()


@contextmanager
def cpu_backend_of(paths) -> Iterator[CpuBackend]:
    """The choices of resolved `paths` (an `ElmoPaths`) for the `with` block."""
    token = _CURRENT.set(CpuBackend(paths.linear == "onednn", paths.threads == "concurrent"))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)


__all__ = ["CpuBackend", "cpu_backend_of", "current_cpu_backend"]
