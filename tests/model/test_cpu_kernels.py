"""The compiled LSTM time loops (`cpu_kernels.py`) against a float64 recomputation of the same layer, step by
step, and their build: cached, written whole, and PyTorch operations wherever they cannot be built."""

import json
import re
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from hf_elmo import ElmoConfig, cpu_kernels

COMPILER = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


@pytest.fixture(autouse=True, scope="module")
def library_of_this_module(tmp_path_factory):
    """The tests build into a folder of their own, and find the library (or not) anew."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_ELMO_CACHE", str(tmp_path_factory.mktemp("cache")))
        cpu_kernels._library.cache_clear()
        yield
    cpu_kernels._library.cache_clear()


@pytest.fixture
def fresh_library(monkeypatch, tmp_path):
    """A test of the build: its own cache folder, nothing found yet."""
    monkeypatch.setenv("HF_ELMO_CACHE", str(tmp_path / "cache"))
    cpu_kernels._library.cache_clear()
    yield
    cpu_kernels._library.cache_clear()


def requires_library():
    if not cpu_kernels.available(torch.zeros(1)):
        if COMPILER is not None:
            pytest.fail(f"{COMPILER} is here but the CPU LSTM kernels did not build")
        pytest.skip("no C++ compiler here")


BATCH_SIZES = [4, 4, 3, 1, 1]  # B = 5 rows: lengths 5, 2, 2, 1 and one row of none; a step of one row
BATCH = 5


def layer_inputs(K, D, P, seed, scale=2.0, batch_sizes=BATCH_SIZES, batch=BATCH):
    """Random float32 input products `(K, N, 4D)`, starting states `(K, B, P)`, `(K, B, D)`, weights `(K, 4D, P)`,
    `(K, P, D)`, large enough for both clips to trigger."""
    generator = torch.Generator().manual_seed(seed)
    N = sum(batch_sizes)

    def random(*shape, s=scale):
        return torch.randn(*shape, generator=generator) * s

    return (
        random(K, N, 4 * D),
        random(K, batch, P, s=0.5),
        random(K, batch, D),
        random(K, 4 * D, P, s=1.0),
        random(K, P, D, s=1.0),
    )


def float64_layer(gates_in, hidden0, memory0, W_h, W_p, cell_clip, proj_clip, batch_sizes=BATCH_SIZES):
    """The straightforward step-by-step layer in float64 on the packed layout: per step its activations, cells before
    and after the clip, tanh, cell outputs, outputs before and after the clip (each `(K, N, width)`), and the
    final states `(K, B, P)`, `(K, B, D)`."""
    keep = {name: [] for name in ("gates", "raw_cells", "cells", "cell_tanh", "cell_outputs", "raw_outputs", "outputs")}
    hidden, memory = hidden0, memory0
    final_hidden, final_memory = list(hidden0.unbind(1)), list(memory0.unbind(1))
    offset = 0
    for n in batch_sizes:
        z = gates_in[:, offset : offset + n] + hidden[:, :n] @ W_h.transpose(1, 2)
        i, f, g, o = z.chunk(4, dim=-1)
        i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
        raw_cell = f * memory[:, :n] + i * g
        cell = raw_cell.clamp(-cell_clip, cell_clip) if cell_clip is not None else raw_cell
        cell_output = o * cell.tanh()
        raw_output = cell_output @ W_p.transpose(1, 2)
        output = raw_output.clamp(-proj_clip, proj_clip) if proj_clip is not None else raw_output
        for name, value in zip(
            keep, [torch.cat([i, f, g, o], -1), raw_cell, cell, cell.tanh(), cell_output, raw_output, output]
        ):
            keep[name].append(value)
        for r in range(n):
            final_hidden[r], final_memory[r] = output[:, r], cell[:, r]
        hidden, memory = output, cell
        offset += n
    packed = {name: torch.cat(values, dim=1) for name, values in keep.items()}
    return packed, torch.stack(final_hidden, 1), torch.stack(final_memory, 1)


CASES = [(2, 24, 8, 3.0, 1.0), (1, 13, 5, 3.0, 1.0), (2, 13, 6, None, None), (1, 32, 8, None, 1.0)]
CASE_IDS = ["two directions, clips", "one direction, width off the vector", "no clips", "projection clip only"]


@pytest.mark.parametrize("K, D, P, cell_clip, proj_clip", CASES, ids=CASE_IDS)
def test_forward_sequence_is_the_float64_layer(K, D, P, cell_clip, proj_clip):
    requires_library()
    gates_in, hidden0, memory0, W_h, W_p = layer_inputs(K, D, P, seed=D + P)
    expected, _, _ = float64_layer(*(t.double() for t in (gates_in, hidden0, memory0, W_h, W_p)), cell_clip, proj_clip)
    if cell_clip is not None:
        assert (expected["raw_cells"].abs() > cell_clip).any()
    if proj_clip is not None:
        assert (expected["raw_outputs"].abs() > proj_clip).any()
    N = gates_in.shape[1]
    got = {
        name: torch.full((K, N, P if "outputs" in name and name != "cell_outputs" else D), float("nan"))
        for name in ("raw_cells", "cells", "cell_tanh", "cell_outputs", "raw_outputs", "outputs")
    }
    got["gates"] = gates_in.clone()
    cpu_kernels.forward_sequence(
        BATCH_SIZES,
        W_h,
        W_p,
        cell_clip,
        proj_clip,
        True,
        got["gates"],
        hidden0,
        memory0,
        got["raw_cells"] if cell_clip is not None else None,
        got["cells"],
        got["cell_tanh"],
        got["cell_outputs"],
        got["raw_outputs"] if proj_clip is not None else None,
        got["outputs"],
    )
    for name, want in expected.items():
        if (name == "raw_cells" and cell_clip is None) or (name == "raw_outputs" and proj_clip is None):
            continue
        assert (got[name].double() - want).abs().max() <= 1e-5 * max(1.0, want.abs().max()), name


@pytest.mark.parametrize("K, D, P, cell_clip, proj_clip", CASES, ids=CASE_IDS)
def test_forward_sequence_without_saving_keeps_each_rows_final_cell(K, D, P, cell_clip, proj_clip):
    requires_library()
    gates_in, hidden0, memory0, W_h, W_p = layer_inputs(K, D, P, seed=D + P + 1)
    expected, _, final_memory = float64_layer(
        *(t.double() for t in (gates_in, hidden0, memory0, W_h, W_p)), cell_clip, proj_clip
    )
    cells = memory0.clone()
    outputs = torch.full((K, gates_in.shape[1], P), float("nan"))
    cpu_kernels.forward_sequence(
        BATCH_SIZES,
        W_h,
        W_p,
        cell_clip,
        proj_clip,
        False,
        gates_in.clone(),
        hidden0,
        memory0,
        None,
        cells,
        torch.empty(K, BATCH, D),
        torch.empty(K, BATCH, D),
        None,
        outputs,
    )
    assert (outputs.double() - expected["outputs"]).abs().max() <= 1e-5 * max(1.0, expected["outputs"].abs().max())
    assert (cells.double() - final_memory).abs().max() <= 1e-5 * max(1.0, final_memory.abs().max())


@pytest.mark.parametrize("K", [1, 2])
def test_forward_without_saving_over_many_rows_and_long_sums(K):
    """Inference steps of few rows read weights packed for them (on AVX-512 builds), steps of many rows go to the
    BLAS: steps of 70 rows (BLAS), 13 and 7 (whole blocks of rows and a rest), 1; sums over 136 and 40 terms."""
    requires_library()
    D, P, batch_sizes = 40, 136, [70, 70, 13, 7, 6, 1, 1, 1]
    gates_in, hidden0, memory0, W_h, W_p = layer_inputs(K, D, P, seed=7, batch_sizes=batch_sizes, batch=70)
    # Weights of a trained model's scale, where rounding errors do not grow from step to step.
    W_h, W_p = W_h / P**0.5, W_p / D**0.5
    expected, _, final_memory = float64_layer(
        *(t.double() for t in (gates_in, hidden0, memory0, W_h, W_p)), 3.0, 1.0, batch_sizes=batch_sizes
    )
    cells = memory0.clone()
    outputs = torch.full((K, gates_in.shape[1], P), float("nan"))
    B = batch_sizes[0]
    cpu_kernels.forward_sequence(
        batch_sizes, W_h, W_p, 3.0, 1.0, False, gates_in.clone(), hidden0, memory0, None, cells,
        torch.empty(K, B, D), torch.empty(K, B, D), None, outputs,
    )  # fmt: skip
    # Each value is a float32 sum of at most P products, then squashed: within P units of float32 rounding of the
    # largest value at most.
    tolerance = P * 2**-24 * max(1.0, expected["outputs"].abs().max())
    assert (outputs.double() - expected["outputs"]).abs().max() <= tolerance
    assert (cells.double() - final_memory).abs().max() <= P * 2**-24 * max(1.0, final_memory.abs().max())


def test_packed_weights_follow_in_place_changes_and_go_with_their_weights():
    """Inference keeps each weight's packed panels between calls: a weight changed in place is packed again (the
    second call gives the float64 layer of the new weights), and its panels go when it is freed."""
    requires_library()
    if not cpu_kernels.packed_products_built():
        pytest.skip("this build forms every product through the BLAS (no AVX-512)")
    D, P, batch_sizes = 40, 136, [9, 9, 7, 5, 5, 1]
    gates_in, hidden0, memory0, W_h, W_p = layer_inputs(1, D, P, seed=11, batch_sizes=batch_sizes, batch=9)
    state_weight, projection_weight = (W_h[0] / P**0.5).clone(), (W_p[0] / D**0.5).clone()

    def run_and_compare(state_weight, projection_weight):
        outputs = torch.full((1, gates_in.shape[1], P), float("nan"))
        cpu_kernels.forward_sequence(
            batch_sizes, [state_weight], [projection_weight], 3.0, 1.0, False, gates_in.clone(), hidden0, memory0,
            None, memory0.clone(), torch.empty(1, 9, D), torch.empty(1, 9, D), None, outputs,
        )  # fmt: skip
        weights = (state_weight.detach()[None].double(), projection_weight.detach()[None].double())
        expected, _, _ = float64_layer(
            gates_in.double(), hidden0.double(), memory0.double(), *weights, 3.0, 1.0, batch_sizes=batch_sizes
        )
        tolerance = P * 2**-24 * max(1.0, expected["outputs"].abs().max())
        assert (outputs.double() - expected["outputs"]).abs().max() <= tolerance

    run_and_compare(state_weight, projection_weight)
    assert id(state_weight) in cpu_kernels._packed_panels
    state_weight[: 2 * D].mul_(-0.5)  # in place, as `load_state_dict` or an optimizer step would
    run_and_compare(state_weight, projection_weight)
    keys = id(state_weight), id(projection_weight)
    del state_weight, projection_weight
    assert not any(key in cpu_kernels._packed_panels for key in keys)
    # Weights that train are packed at each call: a write through `.data` counts no version.
    training = (W_h[0] / P**0.5).requires_grad_(), (W_p[0] / D**0.5).requires_grad_()
    run_and_compare(*training)
    assert id(training[0]) not in cpu_kernels._packed_panels
    training[0].data[: 2 * D].mul_(-0.5)
    run_and_compare(*training)


@pytest.mark.parametrize("K, D, P, cell_clip, proj_clip", CASES, ids=CASE_IDS)
def test_backward_sequence_is_the_float64_gradient(K, D, P, cell_clip, proj_clip):
    """Gradients of the gate inputs and starting states, and the weight gradients formed from what the loop leaves,
    against autograd through the float64 layer, given gradients of every output and of the final states."""
    requires_library()
    inputs = layer_inputs(K, D, P, seed=D + P + 2)
    gates_in, hidden0, memory0, W_h, W_p = inputs
    leaves = [t.double().requires_grad_() for t in inputs]
    expected, final_hidden, final_memory = float64_layer(*leaves, cell_clip, proj_clip)
    generator = torch.Generator().manual_seed(3)
    grad_outputs, grad_hidden, grad_memory = (
        torch.randn(t.shape, generator=generator) for t in (expected["outputs"], final_hidden, final_memory)
    )
    torch.autograd.backward(
        [expected["outputs"], final_hidden, final_memory],
        [grad_outputs.double(), grad_hidden.double(), grad_memory.double()],
    )

    saved = {name: value.detach().float() for name, value in expected.items()}
    gates = saved["gates"].clone()
    grad_projected = torch.full_like(grad_outputs, float("nan"))
    cpu_kernels.backward_sequence(
        BATCH_SIZES,
        W_h,
        W_p,
        cell_clip,
        proj_clip,
        gates,
        memory0,
        saved["raw_cells"] if cell_clip is not None else None,
        saved["cells"],
        saved["cell_tanh"],
        saved["raw_outputs"] if proj_clip is not None else None,
        grad_outputs,
        grad_projected,
        grad_hidden,
        grad_memory,
    )
    # The hidden state each step starts from: the starting one for step 0, the step before's output after that.
    entering = torch.cat(
        [
            hidden0[:, : BATCH_SIZES[0]],
            *(saved["outputs"][:, o : o + n] for o, n in zip(np.cumsum([0, *BATCH_SIZES[:-2]]), BATCH_SIZES[1:])),
        ],
        dim=1,
    )
    got = {
        "gate inputs": (gates, leaves[0].grad),
        "starting hidden": (grad_hidden, leaves[1].grad),
        "starting memory": (grad_memory, leaves[2].grad),
        "W_h": (gates.transpose(1, 2) @ entering, leaves[3].grad),
        "W_p": (grad_projected.transpose(1, 2) @ saved["cell_outputs"], leaves[4].grad),
    }
    for name, (value, want) in got.items():
        assert (value.double() - want).abs().max() <= 1e-4 * want.abs().max(), name


def test_saturation_and_nan_as_float64_does():
    """Gate inputs at +-inf, far out and NaN: NaN stays NaN (a diverging run must show), the rest saturates."""
    requires_library()
    D, P = 9, 3
    gates_in = torch.tensor([float("inf"), float("-inf"), 200.0, -200.0, 90.0, -90.0, 0.0, 1e-3, float("nan")])
    gates_in = gates_in.repeat(4).view(1, 1, 4 * D)
    hidden0, memory0 = torch.zeros(1, 1, P), torch.linspace(-2, 2, D).view(1, 1, D)
    W_h, W_p = torch.zeros(1, 4 * D, P), torch.eye(P, D).unsqueeze(0)
    with_batch = [1]
    cells = torch.empty(1, 1, D)
    gates, outputs, cell_tanh, cell_outputs = (
        gates_in.clone(),
        torch.empty(1, 1, P),
        torch.empty(1, 1, D),
        torch.empty(1, 1, D),
    )
    cpu_kernels.forward_sequence(
        with_batch,
        W_h,
        W_p,
        None,
        None,
        True,
        gates,
        hidden0,
        memory0,
        None,
        cells,
        cell_tanh,
        cell_outputs,
        None,
        outputs,
    )
    i, f, g, o = gates_in.double().chunk(4, -1)
    want_cell = f.sigmoid() * memory0.double() + i.sigmoid() * g.tanh()
    for got, want in [
        (gates, torch.cat([i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()], -1)),
        (cells, want_cell),
        (cell_outputs, o.sigmoid() * want_cell.tanh()),
    ]:
        assert torch.equal(got.isnan(), want.isnan())
        finite = ~want.isnan()
        assert (got.double()[finite] - want[finite]).abs().max() <= 1e-6


def test_mismatched_buffers_are_refused():
    requires_library()
    gates_in, hidden0, memory0, W_h, W_p = layer_inputs(2, 8, 4, seed=0)
    N = gates_in.shape[1]
    buffers = [torch.empty(2, N, 8) for _ in range(3)]
    with pytest.raises(ValueError, match=r"expected contiguous float32 of shape \(2, 5, 4\)"):
        cpu_kernels.forward_sequence(
            BATCH_SIZES,
            W_h,
            W_p,
            None,
            None,
            True,
            gates_in,
            hidden0[:, :, :3],
            memory0,
            None,
            *buffers,
            None,
            torch.empty(2, N, 4),
        )
    with pytest.raises(ValueError, match="expected 13 packed positions, got 12"):
        cpu_kernels.forward_sequence(
            BATCH_SIZES,
            W_h,
            W_p,
            None,
            None,
            True,
            gates_in[:, 1:],
            hidden0,
            memory0,
            None,
            *buffers,
            None,
            torch.empty(2, N, 4),
        )
    with pytest.raises(ValueError, match="expected contiguous float32"):
        cpu_kernels.forward_sequence(
            BATCH_SIZES,
            W_h.transpose(1, 2).contiguous().transpose(1, 2),
            W_p,
            None,
            None,
            True,
            gates_in,
            hidden0,
            memory0,
            None,
            *buffers,
            None,
            torch.empty(2, N, 4),
        )


@pytest.mark.parametrize("cols", [1, 13, 1024])
def test_logsumexp_rows_and_gradient_are_float64s(cols):
    """Rows of ordinary logits, a row with one -inf (a left-out sample), all -inf, one +inf and one NaN: as
    torch.logsumexp in float64, and the gradient as float64's softmax times the incoming gradient."""
    requires_library()
    generator = torch.Generator().manual_seed(cols)
    logits = torch.randn(8, cols, generator=generator) * 20 - 30
    logits[1, 0] = float("-inf")
    logits[2] = float("-inf")
    logits[3, -1] = float("inf")
    logits[4, cols // 2] = float("nan")
    totals = cpu_kernels.logsumexp_rows(logits)
    expected = torch.logsumexp(logits.double(), dim=1)
    assert torch.equal(totals.isnan(), expected.isnan()) and torch.equal(totals.isinf(), expected.isinf())
    finite = expected.isfinite()
    assert (totals.double() - expected)[finite].abs().max() <= 1e-6 * expected[finite].abs().max()
    grad = torch.randn(8, generator=generator)
    ordinary = [0, 5, 6, 7] + ([1] if cols > 1 else [])  # a row of one -inf is a row of nothing but -inf
    got = cpu_kernels.logsumexp_rows_backward(logits[ordinary], totals[ordinary], grad[ordinary])
    want = torch.softmax(logits[ordinary].double(), dim=1) * grad[ordinary, None].double()
    assert (got.double() - want).abs().max() <= 1e-6 * want.abs().max()


def window_max_float64(chars, weight, num_windows):
    """The max over windows as the straightforward float64 computation: every window times the filters, the first
    of equal maxima (`torch.max`)."""
    windows = chars.double()[:, : num_windows + weight.shape[2] - 1].unfold(1, weight.shape[2], 1).flatten(2)
    return (windows @ weight.double().flatten(1).t()).max(dim=1)


@pytest.mark.parametrize(
    "words, num_windows, channels, width, filters", [(7, 5, 4, 3, 6), (40, 12, 16, 5, 128), (3, 1, 2, 1, 9)]
)
def test_window_max_and_gradient_are_float64s(words, num_windows, channels, width, filters):
    """Values, and gradients of characters and filters through the window each maximum was taken at, against
    float64; word 0 repeats one character, so all its windows tie and the first must take the gradient."""
    requires_library()
    generator = torch.Generator().manual_seed(words)
    chars = torch.randn(words, num_windows + width - 1, channels, generator=generator)
    chars[0] = chars[0, :1]
    weight = torch.randn(filters, channels, width, generator=generator)
    grad = torch.randn(words, filters, generator=generator)

    chars.requires_grad_(True), weight.requires_grad_(True)
    values = cpu_kernels.WindowMax.apply(chars, weight, num_windows)
    values.backward(grad)
    chars64, weight64 = chars.detach().double().requires_grad_(True), weight.detach().double().requires_grad_(True)
    expected = window_max_float64(chars64, weight64, num_windows).values
    expected.backward(grad.double())

    assert (values.double() - expected).abs().max() <= 1e-5 * expected.abs().max()
    for got, want in ((chars.grad, chars64.grad), (weight.grad, weight64.grad)):
        assert got.shape == want.shape
        assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()
    if num_windows > 1:  # the first window, characters 0 to width - 1, took every gradient of word 0
        assert chars.grad[0, width:].abs().max() == 0 and chars.grad[0, 0].abs().max() > 0


def test_window_max_lets_nan_win_as_torch_max_does():
    """A NaN product is the maximum, whatever comes before or after it; infinities are ordinary values."""
    requires_library()
    chars = torch.ones(4, 5, 1)
    chars[0, 2] = float("nan")
    chars[1, 0] = float("nan")
    chars[2, 3] = float("inf")
    chars[3, 1] = float("-inf")
    weight = torch.ones(2, 1, 1)
    weight[1] = -1
    values = cpu_kernels.WindowMax.apply(chars, weight, 5)
    expected = window_max_float64(chars, weight, 5).values.float()
    assert torch.equal(values.isnan(), expected.isnan())
    assert torch.equal(values[~values.isnan()], expected[~expected.isnan()])


def test_exp_is_float32_exp_over_the_whole_range():
    """exp(x) (the gradient of a one-column log-sum-exp at total 0) from underflow through subnormals to
    overflow: within two units in the last place of float64's where float32 is normal, within the smallest
    subnormal below that, 0 and infinity beyond."""
    requires_library()
    x = torch.cat([torch.linspace(-110, 90, 400_001), torch.tensor([88.7228, 88.73, -103.97, -104.0, 0.0])])
    got = cpu_kernels.logsumexp_rows_backward(x[:, None], torch.zeros(len(x)), torch.ones(len(x)))[:, 0].double()
    want = x.double().exp()
    normal = (want >= torch.finfo(torch.float32).tiny) & (want <= torch.finfo(torch.float32).max)
    assert ((got - want).abs() / want)[normal].max() <= 2 * torch.finfo(torch.float32).eps / 2
    assert (got - want)[want < torch.finfo(torch.float32).tiny].abs().max() <= 1.5e-45
    assert torch.isinf(got[want > torch.finfo(torch.float32).max]).all()


def test_built_once_into_the_cache_and_reused(fresh_library, tmp_path):
    requires_library()
    built = sorted((tmp_path / "cache" / "kernels").iterdir())
    # The library and its record alone: no source or partial file left beside it.
    assert [p.name for p in built] == [built[0].name, f"{built[0].name}.record.json"] and built[0].suffix == ".so"
    cpu_kernels._library.cache_clear()
    modified = built[0].stat().st_mtime_ns
    assert cpu_kernels.available(torch.zeros(1))
    assert built[0].stat().st_mtime_ns == modified


@pytest.mark.parametrize("reason", ["no compiler", "compiler fails", "cache is a file", "no BLAS"])
def test_pytorch_operations_where_no_library(fresh_library, monkeypatch, tmp_path, reason):
    """Not available, saying why once, in one line."""
    expected = {
        "no compiler": "no C\\+\\+ compiler found",
        "compiler fails": "could not build them",
        "cache is a file": rf"\(HF_ELMO_CACHE={re.escape(str(tmp_path / 'cache'))}: a file, expected a folder\)",
        "no BLAS": "does not export sgemm_",
    }
    if reason == "no compiler":
        monkeypatch.delenv("CXX", raising=False)
        monkeypatch.setattr(shutil, "which", lambda name: None)
    elif reason == "compiler fails":
        monkeypatch.setenv("CXX", sys.executable)  # not a compiler: every build command fails
    elif reason == "cache is a file":
        (tmp_path / "cache").write_text("a file where the cache folder would be")
    else:
        monkeypatch.setattr(cpu_kernels, "_sgemm_address", lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not cpu_kernels.available(torch.zeros(1))
        assert not cpu_kernels.available(torch.zeros(1))
    shown = [warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught]
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and re.search(expected[reason], messages[0]), messages
    assert len(shown) == 1 and shown[0].count("\n") == 1, shown


def test_other_dtypes_and_devices_use_pytorch():
    assert not cpu_kernels.available(torch.zeros(1, dtype=torch.float64))
    assert not cpu_kernels.available(torch.zeros(1, dtype=torch.bfloat16))
    assert not cpu_kernels.available(torch.zeros(1, device="meta"))


def test_loads_beside_pytorchs_openmp_only():
    """Built with OpenMP, the library must share PyTorch's OpenMP runtime, not start a second one beside it. In a
    process of its own: other packages the suite imports (scikit-learn) bring OpenMP runtimes of their own."""
    requires_library()
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/maps")
    script = (
        "import json, torch\nfrom pathlib import Path\nfrom hf_elmo import cpu_kernels\n"
        "assert cpu_kernels.available(torch.zeros(1))\n"
        "maps = Path('/proc/self/maps').read_text().splitlines()\n"
        "names = {l.split()[-1] for l in maps if 'libgomp' in l or 'libomp' in l or 'libiomp' in l}\n"
        "print(json.dumps(sorted(names)))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    runtimes = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(runtimes) == 1 and "torch" in runtimes[0], runtimes


def test_dropout_keeps_with_pytorchs_probability_and_scale(monkeypatch):
    """`ElmoDropout` in training on a float32 CPU tensor: the compiled mask, each value kept with probability
    1 - p independently of its neighbours, kept values scaled exactly as PyTorch's dropout scales them, the
    gradient through the same mask, repeated under the same seed and new at each call."""
    requires_library()
    from hf_elmo import modeling_elmo

    calls = []
    compiled = cpu_kernels.dropout
    monkeypatch.setattr(cpu_kernels, "dropout", lambda *args: calls.append(1) or compiled(*args))
    p, n = 0.1, 1_000_000
    module = modeling_elmo.ElmoDropout(ElmoConfig(dropout=p)).train()
    x = (torch.rand(1000, 1000) + 0.5).requires_grad_()
    torch.manual_seed(0)
    out = module(x)
    kept = out != 0
    # The keep fraction within 5 standard deviations of a Bernoulli(1 - p) mean.
    assert abs(kept.float().mean().item() - (1 - p)) <= 5 * (p * (1 - p) / n) ** 0.5
    for shift in [(0, 1), (1, 0)]:  # neighbours along a row and down a column
        a, b = kept[: 1000 - shift[0], : 1000 - shift[1]], kept[shift[0] :, shift[1] :]
        assert abs(torch.corrcoef(torch.stack([a.flatten().float(), b.flatten().float()]))[0, 1]) <= 5 / n**0.5
    scale = torch.tensor(1.0) / torch.tensor(1 - p)  # PyTorch's CPU dropout: float32 1 / (1 - p)
    assert torch.equal(out[kept], (x * scale)[kept])
    grad = torch.randn(1000, 1000)
    out.backward(grad)
    assert torch.equal(x.grad, grad * (kept * scale))
    torch.manual_seed(0)
    assert torch.equal(module(x), out)
    assert not torch.equal(module(x), out)
    assert len(calls) == 4  # forward, backward and two forwards, all compiled
    assert torch.equal(module.eval()(x), x)


def test_first_use_under_autocast_still_builds(fresh_library):
    """The first call may come from inside a bfloat16 autocast region (an optimizer step there, say): the check of
    the BLAS product at load must not be fooled by autocast's rounding."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        available = cpu_kernels.available(torch.zeros(1))
    if not available and COMPILER is not None:
        pytest.fail("the library did not load when first asked for under autocast")
