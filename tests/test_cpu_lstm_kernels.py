"""The compiled LSTM step (`cpu_lstm_kernels.py`) against a float64 recomputation of the same step, and its build:
cached, written whole, and PyTorch operations wherever it cannot be built."""

import shutil
import subprocess
import sys

import pytest
import torch

from hf_elmo import cpu_lstm_kernels

COMPILER = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


@pytest.fixture(autouse=True)
def fresh_library(monkeypatch, tmp_path):
    """Each test builds into a folder of its own, and finds the library (or not) anew."""
    monkeypatch.setenv("HF_ELMO_CACHE", str(tmp_path / "cache"))
    cpu_lstm_kernels._library.cache_clear()
    yield
    cpu_lstm_kernels._library.cache_clear()


def requires_library():
    if not cpu_lstm_kernels.available(torch.zeros(1)):
        if COMPILER is not None:
            pytest.fail(f"{COMPILER} is here but the CPU LSTM kernels did not build")
        pytest.skip("no C++ compiler here")


def step_inputs(K, n, D, generator, scale=3.0):
    """Gate inputs and products `(K, n, 4D)` and entering cells `(K, n, D)`, each a view with rows further apart than
    their width (as the kernels meet them: blocks of larger buffers)."""

    def strided(width):
        return (torch.randn(K, n, width + 5, generator=generator) * scale)[..., :width]

    return strided(4 * D), strided(4 * D), strided(D)


def float64_forward(gates_in, product, memory_in, cell_clip):
    gates = gates_in.double() + product.double()
    i, f, g, o = gates.chunk(4, dim=-1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    raw = f * memory_in.double() + i * g
    cell = raw.clamp(-cell_clip, cell_clip) if cell_clip is not None else raw
    return torch.cat([i, f, g, o], dim=-1), raw, cell, cell.tanh(), o * cell.tanh()


@pytest.mark.parametrize("cell_clip", [3.0, None], ids=["clip", "no clip"])
@pytest.mark.parametrize("K, n, D", [(2, 7, 24), (1, 1, 13), (2, 3, 517)])
def test_forward_step_is_the_float64_step(K, n, D, cell_clip):
    """Widths that are and are not a multiple of the vector width, one row, strided rows; the clip triggers."""
    requires_library()
    generator = torch.Generator().manual_seed(D)
    gates_in, product, memory_in = step_inputs(K, n, D, generator)
    outputs = [torch.full((K, n, 4 * D), float("nan"))] + [torch.full((K, n, D), float("nan")) for _ in range(4)]
    gates_out, raw_cell, cell, cell_tanh, cell_output = outputs
    if cell_clip is None:
        cell = raw_cell
    cpu_lstm_kernels.forward_step(gates_in, product, gates_out, memory_in, raw_cell, cell, cell_tanh, cell_output,
                                  cell_clip)  # fmt: skip
    expected = float64_forward(gates_in, product, memory_in, cell_clip)
    if cell_clip is not None:
        assert (expected[1].abs() > cell_clip).any()
    for name, got, want in zip(["gates", "raw cell", "cell", "tanh(cell)", "cell output"],
                               [gates_out, raw_cell, cell, cell_tanh, cell_output], expected):  # fmt: skip
        assert (got.double() - want).abs().max() <= 2e-6 * max(1.0, want.abs().max()), name


def test_forward_step_in_place_keeps_nan_and_saturates():
    """The cell updated in place (as inference does), gate inputs at +-inf, far out and NaN: NaN stays NaN, the
    rest saturates as float64 does."""
    requires_library()
    D = 9
    gates_in = torch.tensor([float("inf"), float("-inf"), 200.0, -200.0, 90.0, -90.0, 0.0, 1e-3, float("nan")])
    gates_in = gates_in.repeat(4).view(1, 1, 4 * D)
    product = torch.zeros_like(gates_in)
    memory = torch.linspace(-2, 2, D).view(1, 1, D)
    expected = float64_forward(gates_in, product, memory, None)
    cell_tanh, cell_output, gates_out = torch.empty(1, 1, D), torch.empty(1, 1, D), torch.empty_like(gates_in)
    cpu_lstm_kernels.forward_step(gates_in, product, gates_out, memory, memory, memory, cell_tanh, cell_output, None)
    for got, want in zip([gates_out, memory, cell_tanh, cell_output], [expected[0], *expected[2:]]):
        assert torch.equal(got.isnan(), want.isnan())
        finite = ~want.isnan()
        assert (got.double()[finite] - want[finite]).abs().max() <= 1e-6


@pytest.mark.parametrize("cell_clip", [3.0, None], ids=["clip", "no clip"])
@pytest.mark.parametrize("K, n, D", [(2, 7, 24), (1, 1, 13), (2, 3, 517)])
def test_backward_step_is_the_float64_gradient(K, n, D, cell_clip):
    """The gate-input gradients and the entering cell's gradient against autograd through the float64 step, given
    the gradients of the cell output and of the new cell."""
    requires_library()
    generator = torch.Generator().manual_seed(D + 1)
    gates_in, product, memory_in = step_inputs(K, n, D, generator)
    gates, raw_cell, cell, cell_tanh, _ = (t.float() for t in float64_forward(gates_in, product, memory_in, cell_clip))
    grad_cell_output = torch.randn(K, n, D, generator=generator)
    grad_cell = torch.randn(K, n, D, generator=generator)

    leaves = [(gates_in.double() + product.double()).requires_grad_(), memory_in.double().requires_grad_()]
    _, _, new_cell, _, new_output = float64_forward(leaves[0], torch.zeros_like(leaves[0]), leaves[1], cell_clip)
    torch.autograd.backward([new_output, new_cell], [grad_cell_output.double(), grad_cell.double()])

    grad_memory = grad_cell.clone()
    cpu_lstm_kernels.backward_step(gates, grad_cell_output, cell_tanh, memory_in, raw_cell, grad_memory, cell_clip)
    for name, got, want in [("gates", gates, leaves[0].grad), ("memory", grad_memory, leaves[1].grad)]:
        assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max(), name


def test_mismatched_rows_are_refused():
    requires_library()
    D = 8
    gates = torch.zeros(2, 3, 4 * D)
    with pytest.raises(ValueError, match="expected float32 rows of 8"):
        cpu_lstm_kernels.backward_step(gates, torch.zeros(2, 3, D), torch.zeros(2, 3, 2 * D)[..., ::2], torch.zeros(2, 3, D),
                                       None, torch.zeros(2, 3, D), None)  # fmt: skip
    with pytest.raises(ValueError, match=r"expected \(2, 3\) rows"):
        cpu_lstm_kernels.backward_step(gates, torch.zeros(2, 2, D), torch.zeros(2, 3, D), torch.zeros(2, 3, D),
                                       None, torch.zeros(2, 3, D), None)  # fmt: skip


def test_built_once_into_the_cache_and_reused(tmp_path):
    requires_library()
    built = list((tmp_path / "cache" / "kernels").iterdir())
    assert [p.suffix for p in built] == [".so"]  # the library alone: no source or partial file left beside it
    cpu_lstm_kernels._library.cache_clear()
    modified = built[0].stat().st_mtime_ns
    assert cpu_lstm_kernels.available(torch.zeros(1))
    assert built[0].stat().st_mtime_ns == modified


@pytest.mark.parametrize("reason", ["switched off", "no compiler", "compiler fails", "cache not writable"])
def test_pytorch_operations_where_no_library(monkeypatch, tmp_path, reason):
    if reason == "switched off":
        monkeypatch.setenv("HF_ELMO_CPU_KERNELS", "0")
    elif reason == "no compiler":
        monkeypatch.delenv("CXX", raising=False)
        monkeypatch.setattr(shutil, "which", lambda name: None)
    elif reason == "compiler fails":
        monkeypatch.setenv("CXX", sys.executable)  # not a compiler: every build command fails
    else:
        (tmp_path / "cache").write_text("a file where the cache folder would be")
    assert not cpu_lstm_kernels.available(torch.zeros(1))


def test_other_dtypes_and_devices_use_pytorch():
    assert not cpu_lstm_kernels.available(torch.zeros(1, dtype=torch.float64))
    assert not cpu_lstm_kernels.available(torch.zeros(1, dtype=torch.bfloat16))
    assert not cpu_lstm_kernels.available(torch.zeros(1, device="meta"))


def test_loads_beside_pytorchs_openmp_only():
    """Built with OpenMP, the library must share PyTorch's OpenMP runtime, not start a second one beside it."""
    requires_library()
    code = (
        "import torch; from hf_elmo import cpu_lstm_kernels as k; assert k.available(torch.zeros(1)); "
        "print(len({l.split()[-1] for l in open('/proc/self/maps') if 'libgomp' in l or 'libomp' in l}))"
    )
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/maps")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(result.stdout) <= 1
