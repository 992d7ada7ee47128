"""The 3xTF32 products of `hf_elmo.gpu_matmul` against float64 products computed by PyTorch.

On a machine without CUDA the kernels run on CPU tensors under Triton's interpreter (conftest.py sets
`TRITON_INTERPRET=1` before hf_elmo is imported), which computes the tensor-core products in plain float32; with
CUDA the same tests run on the GPU, where 1e-5 separates 3xTF32 (about 1e-6) from plain TF32 (about 3e-4).
Shapes are small and odd (not multiples of the blocks) because every interpreted program costs milliseconds.
"""

import pytest
import torch

from hf_elmo import gpu_matmul

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not gpu_matmul.AVAILABLE or (DEVICE == "cpu") != gpu_matmul.INTERPRETED,
    reason="needs Triton, and CUDA or Triton's interpreter",
)

TOLERANCE = 1e-5
"""Largest error relative to the largest reference value: float32 products of these sizes stay near 1e-6."""


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return ((value.double() - reference).abs().max() / reference.abs().max()).item()


def operand(shape, layout, device=DEVICE):
    """A random float32 tensor of `shape` stored as `layout`: "contiguous", "transposed" (the last two dimensions
    swapped in memory) or "strided" (every other element of a wider tensor along the last dimension)."""
    if layout == "contiguous":
        return torch.randn(shape, device=device)
    if layout == "transposed":
        return torch.randn(*shape[:-2], shape[-1], shape[-2], device=device).transpose(-1, -2)
    wide = torch.randn(*shape[:-1], 2 * shape[-1], device=device)
    return wide[..., ::2]


def poisoned(*shape):
    return torch.full(shape, float("nan"), device=DEVICE)


PRODUCTS = [
    # (batch or None for 2-D, M, N, K, layout of a, layout of b, addend shape or None)
    (None, 37, 45, 50, "contiguous", "contiguous", None),
    (None, 33, 65, 19, "transposed", "strided", (65,)),
    (1, 33, 40, 47, "transposed", "transposed", (1, 1, 40)),
    (2, 70, 35, 47, "strided", "contiguous", (2, 70, 35)),
    (2, 17, 33, 64, "contiguous", "transposed", (2, 1, 33)),
]


@pytest.mark.parametrize("batch, m, n, k, layout_a, layout_b, add_shape", PRODUCTS)
def test_product_equals_float64_product_and_writes_every_element(batch, m, n, k, layout_a, layout_b, add_shape):
    lead = () if batch is None else (batch,)
    a, b = operand((*lead, m, k), layout_a), operand((*lead, k, n), layout_b)
    add = torch.randn(add_shape, device=DEVICE) if add_shape is not None else None
    expected = a.double() @ b.double() + (add.double() if add is not None else 0)
    out = poisoned(*lead, m, n)
    result = gpu_matmul.matmul(a, b, add, out=out)
    assert result is out
    assert not out.isnan().any()
    assert relative_error(out, expected) <= TOLERANCE


@pytest.mark.parametrize("k, split_k", [(601, 3), (40, 100)])  # more parts than K blocks: one part per block
def test_split_k_sums_its_parts_into_a_strided_output(k, split_k):
    a = operand((2, 45, k), "transposed")
    b = operand((2, k, 38), "contiguous")
    add = operand((2, 45, 38), "strided")
    wide = poisoned(2, 45, 80)
    out = wide[:, :, 3:79:2]  # every other column of a wider buffer: the kernel must skip the others
    gpu_matmul.matmul(a, b, add, out=out, split_k=split_k)
    assert relative_error(out, a.double() @ b.double() + add.double()) <= TOLERANCE
    written = torch.zeros_like(wide, dtype=torch.bool)
    written[:, :, 3:79:2] = True
    assert not out.isnan().any() and wide[~written].isnan().all()


def config_name(config) -> str:
    k = config.kwargs
    return f"{k['BLOCK_M']}x{k['BLOCK_N']}x{k['BLOCK_K']}-w{config.num_warps}-s{config.num_stages}"


@pytest.mark.parametrize("layouts, split_k", [(("contiguous", "transposed"), 1), (("transposed", "contiguous"), 2)])
@pytest.mark.parametrize("config", gpu_matmul._CONFIGS if gpu_matmul.AVAILABLE else [], ids=config_name)
def test_every_autotuning_candidate_computes_the_product(config, layouts, split_k):
    # Autotuning keeps whichever candidate is fastest for a shape class: each must be right on its own.
    a, b = operand((2, 130, 90), layouts[0]), operand((2, 90, 70), layouts[1])
    add = torch.randn(2, 1, 70, device=DEVICE)
    out = poisoned(2, 130, 70)
    gpu_matmul._product(a, b, add, out, split_k, config)
    assert not out.isnan().any()
    assert relative_error(out, a.double() @ b.double() + add.double()) <= TOLERANCE


def test_split_k_and_whole_k_agree():
    a, b, add = operand((2, 40, 300), "contiguous"), operand((2, 300, 36), "transposed"), torch.randn(36, device=DEVICE)
    whole = gpu_matmul.matmul(a, b, add, split_k=1)
    split = gpu_matmul.matmul(a, b, add, split_k=4)
    assert relative_error(split, whole.double()) <= TOLERANCE


def test_split_k_fills_the_multiprocessors_only_for_small_outputs():
    sms = 132  # an H100
    # ELMo's (original size) backward step products: 2 directions x (B, 16384) @ (16384, 512).
    for rows in (128, 1024):
        split = gpu_matmul.choose_split_k(2, rows, 512, 16384, sms)
        programs = 2 * (rows // 128) * 4 * split
        assert split > 1 and sms // 2 < programs <= sms and 16384 // split >= gpu_matmul._MIN_K_PER_SPLIT
    # Products with enough output tiles, or too few terms to share, stay whole.
    assert gpu_matmul.choose_split_k(2, 2560, 16384, 512, sms) == 1
    assert gpu_matmul.choose_split_k(2, 128, 512, 900, sms) == 1


def test_empty_inner_dimension_gives_the_addend():
    add = torch.randn(2, 1, 9, device=DEVICE)
    out = gpu_matmul.matmul(torch.randn(2, 5, 0, device=DEVICE), torch.randn(2, 0, 9, device=DEVICE), add)
    assert torch.equal(out, add.expand(2, 5, 9))
    assert gpu_matmul.matmul(torch.randn(0, 4, device=DEVICE), torch.randn(4, 3, device=DEVICE)).shape == (0, 3)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's NumPy product
def test_non_finite_inputs_give_what_a_float32_product_gives():
    a, b = torch.randn(20, 24, device=DEVICE), torch.rand(24, 18, device=DEVICE) + 0.5
    a[3, 5] = float("inf")
    a[7, 0] = float("nan")
    result = gpu_matmul.matmul(a, b)
    expected = a.double() @ b.double()
    assert torch.equal(result.isinf(), expected.isinf()) and torch.equal(result.isnan(), expected.isnan())
    assert result.isinf().any() and result.isnan().any()
    finite = expected.isfinite()
    assert relative_error(result[finite], expected[finite]) <= TOLERANCE


def float64_grads(function, inputs, grad):
    """Gradients of `function` at `inputs` in float64 (PyTorch's own operations), upstream gradient `grad`."""
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in inputs]
    output = function(*leaves)
    output.backward(grad.double())
    return output.detach(), [t.grad if t is not None else None for t in leaves]


def check_grads(ours, reference_function, inputs):
    """Runs `ours` on `inputs` (leaves with `requires_grad`) and compares value and gradients with float64."""
    output = ours(*inputs)
    grad = torch.randn_like(output)
    output.backward(grad)
    expected, expected_grads = float64_grads(reference_function, inputs, grad)
    assert relative_error(output, expected) <= TOLERANCE
    for t, expected_grad in zip(inputs, expected_grads):
        if t is not None:
            assert t.grad.shape == t.shape
            assert relative_error(t.grad, expected_grad) <= TOLERANCE


@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_value_and_gradients(with_bias):
    x = torch.randn(3, 2, 5, 40, device=DEVICE)[:, :, ::2].requires_grad_()  # (3, 2, 3, 40), not a view of rows
    weight = torch.randn(33, 40, device=DEVICE, requires_grad=True)
    bias = torch.randn(33, device=DEVICE, requires_grad=True) if with_bias else None
    check_grads(gpu_matmul.linear, torch.nn.functional.linear, [x, weight, bias])


def test_baddbmm_and_bmm_values_and_gradients():
    add = torch.randn(2, 1, 35, device=DEVICE, requires_grad=True)
    a = torch.randn(2, 21, 47, device=DEVICE, requires_grad=True)
    weight = torch.randn(2, 35, 47, device=DEVICE, requires_grad=True)
    # As in the LSTM: the weight is stored (out, in) and used transposed.
    check_grads(lambda add, a, w: gpu_matmul.baddbmm(add, a, w.transpose(1, 2)),
                lambda add, a, w: torch.baddbmm(add, a, w.transpose(1, 2)), [add, a, weight])  # fmt: skip
    a.grad = weight.grad = None
    check_grads(lambda a, w: gpu_matmul.bmm(a, w.transpose(1, 2)), lambda a, w: torch.bmm(a, w.transpose(1, 2)),
                [a, weight])  # fmt: skip


def test_2d_matmul_gradients():
    a = torch.randn(19, 30, device=DEVICE, requires_grad=True)
    b = torch.randn(30, 23, device=DEVICE, requires_grad=True)
    add = torch.randn(23, device=DEVICE, requires_grad=True)
    check_grads(gpu_matmul.matmul, lambda a, b, add: a @ b + add, [a, b, add])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: gpu_matmul.matmul(torch.randn(3, 4, device=DEVICE).double(), torch.randn(4, 2, device=DEVICE)),
         "a must be float32, got torch.float64"),
        (lambda: gpu_matmul.matmul(torch.randn(3, 4, device=DEVICE), torch.randn(5, 2, device=DEVICE)),
         "inner sizes differ"),
        (lambda: gpu_matmul.matmul(torch.randn(2, 3, 4, device=DEVICE), torch.randn(4, 2, device=DEVICE)),
         "must both be 2-D or both 3-D"),
        (lambda: gpu_matmul.bmm(torch.randn(2, 3, 4, device=DEVICE), torch.randn(3, 4, 2, device=DEVICE)),
         "batch sizes differ"),
        (lambda: gpu_matmul.matmul(torch.randn(3, 4, device=DEVICE), torch.randn(4, 2, device=DEVICE),
                                   torch.randn(3, device=DEVICE)), "does not broadcast"),
        (lambda: gpu_matmul.matmul(torch.randn(3, 4, device=DEVICE, requires_grad=True),
                                   torch.randn(4, 2, device=DEVICE), out=torch.empty(3, 2, device=DEVICE)),
         "out= does not support autograd"),
        (lambda: gpu_matmul.linear(torch.randn(3, 4, device=DEVICE), torch.randn(2, 4, device=DEVICE),
                                   torch.randn(3, device=DEVICE)), "expected (2,)"),
    ],
)  # fmt: skip
def test_bad_input_is_named_in_one_line(call, message):
    with pytest.raises(ValueError, match=r"^gpu_matmul: .*") as error:
        call()
    assert message in str(error.value) and "\n" not in str(error.value)
