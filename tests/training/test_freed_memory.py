"""keep_freed_memory: blocks a step frees are reused by the next step instead of coming back as fresh pages."""

import subprocess
import sys

import pytest

from hf_elmo.commands import train as train_bilm
from hf_elmo.training import freed_memory

pytestmark = pytest.mark.skipif(freed_memory._glibc() is None, reason="the C library is not glibc")

# Steps of four tensors of about 40 MiB (as the original size's gradients: above the highest mmap threshold glibc
# sets itself), sizes varying a little from step to step as a training step's do; the minor page faults of steps 4-9
# per page written. Returned to the system, every page faults again each step (1.0); kept, a block only now and then
# lands where a smaller one was and grows the heap.
_STEPS = """
import importlib.util, resource, sys, torch
spec = importlib.util.spec_from_file_location("freed_memory", sys.argv[2])  # without the package's imports
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
if sys.argv[1] == "keep":
    assert module.keep_freed_memory()
faults = pages = 0
for step in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    tensors = [torch.ones((10 << 20) + 1024 * ((step + k) % 3)) for k in range(4)]
    if step >= 4:
        faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        pages += sum(t.numel() * 4 // 4096 for t in tensors)
    del tensors
print(faults / pages)
"""


def _faults_per_page(mode: str) -> float:
    command = [sys.executable, "-c", _STEPS, mode, freed_memory.__file__]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(result.stdout)


def test_freed_blocks_are_reused_instead_of_faulting_in_fresh_pages():
    returned = _faults_per_page("default")
    if returned < 0.5:
        pytest.skip(f"this glibc reuses freed blocks by itself ({returned:.2f} faults per page)")
    assert _faults_per_page("keep") < 0.25


def test_without_glibc_nothing_is_changed(monkeypatch):
    monkeypatch.setattr(freed_memory, "_glibc", lambda: None)
    assert freed_memory.keep_freed_memory() is False


@pytest.mark.parametrize("keep", [True, False])
def test_train_bilm_keeps_freed_memory_unless_told_not_to(monkeypatch, tmp_path, keep):
    calls = []
    monkeypatch.setattr(train_bilm, "keep_freed_memory", lambda: calls.append(True))
    with pytest.raises(OSError):  # stops at the missing training file, after the setting
        train_bilm.train_bilm(
            output_dir=str(tmp_path / "run"), train_files=[str(tmp_path / "missing.txt")], keep_freed_memory=keep
        )
    assert calls == ([True] if keep else [])
