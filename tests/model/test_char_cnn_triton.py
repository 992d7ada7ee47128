"""The character CNN's fused window products (`char_cnn_triton.py`) against a float64 recomputation, and the
character encoder with them against the reference path: on CUDA tensors where a GPU is at hand, else run by Triton's
interpreter on CPU tensors (`TRITON_INTERPRET=1`, which the suite sets without a GPU)."""

import pytest
import torch
from conftest import reference_from, rounding_bound
from test_fast_path import SENTENCES, encode, random_model, small_config

from hf_elmo import char_cnn_fast, paths_resolution

kernels = pytest.importorskip("hf_elmo.char_cnn_triton")
DEVICE = "cpu" if kernels.INTERPRETED else "cuda"
if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("the kernels need CUDA tensors, or TRITON_INTERPRET=1 for CPU tensors", allow_module_level=True)


def window_max(chars, weight, num_windows, **kwargs):
    """`kernels.window_max` on `DEVICE`, its results back on the CPU."""
    spans = kwargs.pop("spans", None)
    spans = None if spans is None else spans.to(DEVICE)
    values, argmax = kernels.window_max(chars.to(DEVICE), weight.to(DEVICE), num_windows, spans=spans, **kwargs)
    return values.cpu(), None if argmax is None else argmax.cpu()


def leaves(*tensors):
    """Copies on `DEVICE` that take gradients."""
    return [t.to(DEVICE).requires_grad_() for t in tensors]


def dense_window_max(chars, weight, num_windows):
    """`(U, L, e)`, `(n, w e)` -> every window's products `(U, windows, n)`, the unfused way."""
    words, _, slot_dim = chars.shape
    width = weight.shape[1] // slot_dim
    windows = chars.unfold(1, width, 1)[:, :num_windows].transpose(2, 3).reshape(words, num_windows, -1)
    return windows @ weight.t()


def exact_window_products(chars, weight, num_windows):
    """The products of float32 `chars` and `weight` in float64 `(U, windows, n)`, and for each the most that float32
    arithmetic may differ from it, summing its `w e` terms in any order."""
    products = dense_window_max(chars.double(), weight.double(), num_windows)
    magnitudes = dense_window_max(chars.double().abs(), weight.double().abs(), num_windows)
    return products, rounding_bound(magnitudes, weight.shape[1])


@pytest.mark.parametrize(
    "words, slots, slot_dim, width, filters, num_windows",
    [
        (37, 12, 16, 3, 40, 10),  # blocks not filled on any axis
        (5, 50, 16, 7, 300, 44),  # the original model's widest filter over every window
        (70, 9, 4, 2, 16, 8),  # a depth below the smallest block
        (3, 6, 16, 1, 32, 6),
        (20, 20, 16, 5, 8, 3),  # fewer windows than the slots allow
    ],
)
def test_window_max_matches_float64(words, slots, slot_dim, width, filters, num_windows):
    generator = torch.Generator().manual_seed(words)
    chars = torch.randn(words, slots, slot_dim, generator=generator)
    weight = torch.randn(filters, width * slot_dim, generator=generator)
    products, bounds = exact_window_products(chars, weight, num_windows)
    expected = products.max(dim=1)
    values, argmax = window_max(chars, weight, num_windows, save_argmax=True)
    assert values.dtype == torch.float32 and argmax.dtype == torch.int16
    # A max moves by no more than the largest error of what it is taken over.
    assert ((values.double() - expected.values).abs() <= bounds.max(dim=1).values).all()
    # The window taken is the exact max's, or one whose product is within rounding of it.
    taken = products.gather(1, argmax.long().unsqueeze(1)).squeeze(1)
    assert ((expected.values - taken) <= 2 * bounds.max(dim=1).values).all()


def test_first_of_equal_windows_and_nan_win():
    """Equal windows give the first of them (where `torch.max` puts the gradient); a NaN product wins and stays."""
    chars = torch.zeros(2, 10, 16)
    chars[0, 2:4] = 1.0
    chars[1, 7, 0] = float("nan")  # in windows 6 and 7 of width 2
    weight = torch.zeros(16, 32)  # width 2: only each window's first slot counts
    weight[:8, :16], weight[8:, :16] = 1.0, -1.0
    values, argmax = window_max(chars, weight, 9, save_argmax=True)
    assert (values[0, :8] == 16).all() and (argmax[0, :8] == 2).all()  # windows 2 and 3 are equal
    assert (values[0, 8:] == 0).all() and (argmax[0, 8:] == 0).all()  # windows 0, 1 and 4-8 are equal
    assert values[1].isnan().all() and (argmax[1] == 6).all()


@pytest.mark.parametrize(
    "words, slots, slot_dim, width, filters, num_windows",
    [(23, 11, 16, 4, 20, 8), (300, 7, 4, 3, 70, 5)],  # the second: several splits of the words, filter blocks
)
def test_gradients_match_float64(words, slots, slot_dim, width, filters, num_windows):
    generator = torch.Generator().manual_seed(3)
    chars = torch.randn(words, slots, slot_dim, generator=generator, dtype=torch.float64)
    weight = torch.randn(filters, width * slot_dim, generator=generator, dtype=torch.float64)
    grad = torch.randn(words, filters, generator=generator, dtype=torch.float64)
    fused = leaves(chars.float(), weight.float())
    kernels.WindowMax.apply(*fused, num_windows).backward(grad.float().to(DEVICE))
    dense = [chars.clone().requires_grad_(), weight.clone().requires_grad_()]
    dense_window_max(*dense, num_windows).max(dim=1).values.backward(grad)
    for a, b in zip(fused, dense):
        assert (a.grad.cpu().double() - b.grad).abs().max() <= 1e-5 * b.grad.abs().max()


@pytest.fixture
def fused_calls(monkeypatch):
    """The calls of the fused kernels: ("windows", number of windows) and ("highway", rows)."""
    calls = []
    window_max, highway = kernels.WindowMax.apply, kernels.HighwayCombine.apply
    monkeypatch.setattr(
        kernels.WindowMax, "apply", lambda *args: calls.append(("windows", args[2])) or window_max(*args)
    )
    monkeypatch.setattr(
        kernels.HighwayCombine, "apply", lambda *args: calls.append(("highway", len(args[1]))) or highway(*args)
    )
    return calls


def fuse(model, fused: bool, char_cnn: str = "auto"):
    path = "triton" if fused else "torch"
    model.config.paths = {"char_cnn": char_cnn, "window_max": path, "highway": path}


def words_with_runs(num_words: int, long_words: list[int], seed: int) -> torch.LongTensor:
    """`(num_words, 50)` ids: random characters, then a run of one character from a random slot (short, except for the
    rows in `long_words`, which run to the last slots or have none)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 262, (num_words, 50), generator=generator)
    run_start = torch.randint(0, 12, (num_words,), generator=generator)
    run_start[long_words] = torch.tensor([50, 47, 30, 44][: len(long_words)])
    for k in range(num_words):
        ids[k, run_start[k] :] = ids[k, -1]
    return ids


def test_spans_bound_each_block_of_words():
    """With spans, a word's value is its max over a prefix of the windows that covers its span: the dense products'
    running max at some window from its span on."""
    ids = words_with_runs(150, [3, 100], seed=4)
    spans = char_cnn_fast._spans(ids)
    chars = torch.randn(262, 16, generator=torch.Generator().manual_seed(1))[ids]
    weight = torch.randn(24, 5 * 16, generator=torch.Generator().manual_seed(2))
    values, argmax = window_max(chars, weight, 46, save_argmax=True, spans=spans)
    products, bounds = exact_window_products(chars, weight, 46)
    running_max, bound = products.cummax(dim=1).values, bounds.max(dim=1).values  # (U, windows, n), (U, n)
    for word in range(150):
        candidates = running_max[word, max(0, min(int(spans[word]), 46) - 1) :]  # (P, n)
        assert ((candidates - values[word].double()).abs() <= bound[word]).any(dim=0).all(), word
    # Words 128-149 share blocks (of up to 64 words) without a long word: none of them looks at a later window.
    assert int(argmax.max()) >= 40 and (argmax[128:].long() < spans[128:].max()).all()


def test_windows_stop_at_the_spans():
    """Spans the kernel is told, whatever the characters: spans of 2 leave two windows, spans of 0 none (-inf)."""
    generator = torch.Generator().manual_seed(6)
    chars = torch.randn(90, 20, 16, generator=generator)
    weight = torch.randn(24, 3 * 16, generator=generator)
    products, bounds = exact_window_products(chars, weight, 18)
    values, argmax = window_max(chars, weight, 18, save_argmax=True, spans=torch.full((90,), 2))
    assert ((values.double() - products[:, :2].max(dim=1).values).abs() <= bounds[:, :2].max(dim=1).values).all()
    assert (argmax.long() < 2).all()
    values, argmax = window_max(chars, weight, 18, save_argmax=True, spans=torch.zeros(90, dtype=torch.long))
    assert (values == float("-inf")).all() and (argmax == 0).all()


@pytest.mark.parametrize("char_cnn", ["every_word", "distinct_words"])
@pytest.mark.parametrize("ids", ["sentences", "many words"])
def test_encoder_with_fused_windows_matches_reference(char_cnn, ids, fused_calls):
    """Values within 1e-5 and gradients of every character-CNN parameter within 1e-4 relative; "many words" are
    blocks of short words and blocks with a long one."""
    model = random_model(small_config())
    fuse(model, True, char_cnn)
    reference = reference_from(model)
    model.to(DEVICE)
    ids = encode(SENTENCES)["input_ids"] if ids == "sentences" else words_with_runs(200, [5, 130, 140], seed=0)
    fused, expected = model.char_encoder(ids.to(DEVICE)), reference.char_encoder(ids)
    assert {kind for kind, _ in fused_calls} == {"windows", "highway"}
    assert (fused.cpu() - expected).abs().max() <= 1e-5
    weights = torch.randn(fused.shape, generator=torch.Generator().manual_seed(0))
    (weights.to(DEVICE) * fused).sum().backward()
    (weights * expected).sum().backward()
    reference_params = dict(reference.char_encoder.named_parameters())
    for name, param in model.char_encoder.named_parameters():
        scale = reference_params[name].grad.abs().max()
        assert scale > 0, name
        assert (param.grad.cpu() - reference_params[name].grad).abs().max() <= 1e-4 * scale, name


def test_bfloat16_maxima_match_the_unfused_products():
    """Both ways multiply bfloat16 operands with float32 sums; the fused max is rounded once, from sums that may
    differ from the library's in their last bits: the same or one bfloat16 step apart."""
    generator = torch.Generator().manual_seed(5)
    chars = torch.randn(64, 50, 16, generator=generator).bfloat16()
    weight = (0.1 * torch.randn(96, 7 * 16, generator=generator)).bfloat16()
    expected = dense_window_max(chars, weight, 44).max(dim=1).values
    values, _ = window_max(chars, weight, 44, save_argmax=False)
    assert values.dtype == torch.bfloat16
    step = 2.0**-7 * expected.float().abs()
    assert ((values.float() - expected.float()).abs() <= step).all()


def test_autocast_takes_the_fused_kernels_in_bfloat16(fused_calls):
    model = random_model(small_config()).to(DEVICE)
    ids = encode(SENTENCES)["input_ids"].to(DEVICE)
    outputs = {}
    for fused in (False, True):
        fuse(model, fused)
        with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
            outputs[fused] = model.char_encoder(ids).float()
    assert {kind for kind, _ in fused_calls} == {"windows", "highway"}
    assert (outputs[True] - outputs[False]).abs().max() <= 2.0**-6 * outputs[False].abs().max()


def test_highway_combine_computes_float64_in_float64():
    generator = torch.Generator().manual_seed(8)
    product = torch.randn(5, 2 * 40, generator=generator, dtype=torch.float64)
    x = torch.randn(5, 40, generator=generator, dtype=torch.float64)
    transformed, gate = product.relu()[:, :40], product[:, 40:].sigmoid()
    out = kernels.HighwayCombine.apply(product.to(DEVICE), x.to(DEVICE)).cpu()
    assert out.dtype == torch.float64
    assert (out - (transformed + gate * (x - transformed))).abs().max() <= 1e-14


@pytest.mark.parametrize(
    "dtypes",
    [(torch.float32, torch.float32), (torch.bfloat16, torch.float32)],
    ids=["float32", "bfloat16 product, float32 input (autocast)"],
)
def test_highway_combine_matches_float64(dtypes):
    product_dtype, x_dtype = dtypes
    generator = torch.Generator().manual_seed(7)
    product = (2 * torch.randn(37, 2 * 1100, generator=generator, dtype=torch.float64)).to(product_dtype).double()
    x = torch.randn(37, 1100, generator=generator, dtype=torch.float64).to(x_dtype).double()
    grad = torch.randn(37, 1100, generator=generator, dtype=torch.float64)
    fused_inputs = leaves(product.to(product_dtype), x.to(x_dtype))
    out = kernels.HighwayCombine.apply(*fused_inputs)
    out.backward(grad.to(device=DEVICE, dtype=out.dtype))
    exact_inputs = [product.clone().requires_grad_(), x.clone().requires_grad_()]
    transformed, gate = exact_inputs[0].chunk(2, dim=-1)
    transformed, gate = torch.relu(transformed), torch.sigmoid(gate)
    expected = transformed + gate * (exact_inputs[1] - transformed)
    expected.backward(grad)
    assert out.dtype == torch.float32
    assert (out.cpu().double() - expected).abs().max() <= 1e-6 * expected.abs().max()
    for fused_input, exact_input in zip(fused_inputs, exact_inputs):
        assert fused_input.grad.dtype == fused_input.dtype
        # float32 arithmetic (1 - sigmoid loses digits where the gate is near 1, as PyTorch's does), converted once
        # to the input's dtype: within one bfloat16 step (Triton's interpreter truncates where a GPU rounds)
        step = 2.0**-7 if fused_input.dtype == torch.bfloat16 else 0.0
        tolerance = step * exact_input.grad.abs() + 1e-6 * exact_input.grad.abs().max()
        assert ((fused_input.grad.cpu().double() - exact_input.grad).abs() <= tolerance).all()


@pytest.mark.parametrize("field", ["window_max", "highway"])
def test_forcing_without_the_kernel_says_why(monkeypatch, field):
    model = random_model(small_config(paths={field: "triton"}))
    monkeypatch.setattr(paths_resolution, "INTERPRETED", False)
    with pytest.raises(ValueError, match=rf"^paths\.{field}='triton' needs Triton and CUDA tensors .*on cpu\.$"):
        model.char_encoder(encode(SENTENCES)["input_ids"])
