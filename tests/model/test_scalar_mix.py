"""`ScalarMix` against its float64 formula (with and without layer norm over the unmasked positions), gradients and
freezing, the L2 penalty, DDP, bad inputs.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from hf_elmo import ScalarMix


def reference_mix(layers, weights, gamma, mask=None, layer_norm=False):
    """The formula of the paper (and AllenNLP's statistics for layer norm), in float64 NumPy."""
    layers = [np.asarray(layer, dtype=np.float64) for layer in layers]
    if layer_norm:
        m = np.asarray(mask, dtype=np.float64)[..., None]
        normed = []
        for h in layers:
            n = m.sum() * h.shape[-1]
            mean = (h * m).sum() / n
            variance = (((h * m - mean) * m) ** 2).sum() / n
            normed.append((h - mean) / np.sqrt(variance + 1e-13))
        layers = normed
    s = np.exp(weights - np.max(weights))
    s /= s.sum()
    return gamma * sum(s_k * h for s_k, h in zip(s, layers))


def random_layers(num_layers=3, shape=(4, 7, 6)):
    return [torch.randn(shape, dtype=torch.float64) * (k + 1) + k for k in range(num_layers)]


def ragged_mask(shape=(4, 7), lengths=(7, 3, 5, 1)):
    return torch.arange(shape[1])[None, :] < torch.tensor(lengths)[:, None]


def test_initial_values_give_the_plain_average():
    mix = ScalarMix(3)
    assert torch.equal(mix.scalar_parameters.detach(), torch.zeros(3)) and mix.gamma.item() == 1.0
    layers = random_layers()
    expected = reference_mix(layers, np.zeros(3), 1.0)
    np.testing.assert_allclose(mix.double()(layers).detach().numpy(), expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(expected, sum(layer.numpy() for layer in layers) / 3, rtol=0, atol=1e-12)


@pytest.mark.parametrize("layer_norm", [False, True])
def test_matches_float64_formula_with_and_without_layer_norm(layer_norm):
    weights, gamma = np.array([0.25, -1.25, 2.0]), 0.75  # exact in float32, where the parameters start
    mix = ScalarMix(3, initial_weights=weights.tolist(), initial_gamma=gamma, do_layer_norm=layer_norm).double()
    layers, mask = random_layers(), ragged_mask()
    expected = reference_mix(layers, weights, gamma, mask.numpy(), layer_norm)
    np.testing.assert_allclose(mix(layers, mask).detach().numpy(), expected, rtol=0, atol=1e-12)


def test_layer_norm_statistics_ignore_masked_positions_but_normalise_them():
    mix = ScalarMix(2, do_layer_norm=True).double()
    layers, mask = random_layers(2), ragged_mask()
    changed = [layer.masked_fill(~mask[..., None], 1e6) for layer in layers]
    out, out_changed = mix(layers, mask), mix(changed, mask)
    assert torch.allclose(out[mask], out_changed[mask], rtol=0, atol=1e-12)
    assert not torch.allclose(out[~mask], out_changed[~mask])  # padded positions are normalised, not zeroed
    # Without layer norm the mask is ignored.
    plain = ScalarMix(2).double()
    assert torch.equal(plain(layers, mask), plain(layers))


def test_float32_layer_norm_is_close_to_float64():
    layers, mask = random_layers(), ragged_mask()
    expected = reference_mix(layers, np.zeros(3), 1.0, mask.numpy(), layer_norm=True)
    actual = ScalarMix(3, do_layer_norm=True)([layer.float() for layer in layers], mask).detach().numpy()
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_gradients_and_freezing():
    layers = random_layers()
    mix = ScalarMix(3).double()
    mix(layers).sum().backward()
    assert mix.scalar_parameters.grad.abs().sum() > 0 and mix.gamma.grad.abs().sum() > 0
    frozen = ScalarMix(3, initial_weights=[1.0, 0.0, -1.0], trainable=False).double()
    out = frozen([layer.requires_grad_() for layer in layers])
    out.sum().backward()
    assert frozen.scalar_parameters.grad is None and frozen.gamma.grad is None
    # requires_grad switched back on (as loading a checkpoint does) is undone by train()/eval().
    frozen.requires_grad_(True)
    frozen.train()
    assert not frozen.scalar_parameters.requires_grad and not frozen.gamma.requires_grad


def test_l2_penalty_is_the_sum_of_squared_weights():
    mix = ScalarMix(3, initial_weights=[0.5, -2.0, 1.0])
    assert mix.l2_penalty().item() == pytest.approx(0.25 + 4.0 + 1.0)


DDP_SCRIPT = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from hf_elmo import ScalarMix
mix = ScalarMix(3)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    layers = [torch.randn(4, 7, 6) for _ in range(3)]
    DistributedDataParallel(mix)(layers).square().sum().backward()
finally:
    dist.destroy_process_group()
assert mix.scalar_parameters.grad is not None and mix.gamma.grad is not None
print("ok")
"""


def test_parameters_are_plain_tensors_and_work_under_ddp():
    mix = ScalarMix(3)
    assert [name for name, _ in mix.named_parameters()] == ["scalar_parameters", "gamma"]
    assert not any(isinstance(m, torch.nn.ParameterList) for m in mix.modules())
    # In a process of its own, gloo on the loopback interface: a process group, once made, stays with a process, and
    # gloo otherwise resolves the machine's hostname, which can wait on the network.
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    done = subprocess.run(
        [sys.executable, "-c", DDP_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_bad_inputs_give_clear_errors():
    with pytest.raises(ValueError, match="at least one layer"):
        ScalarMix(0)
    with pytest.raises(ValueError, match="2 initial weights for 3 layers"):
        ScalarMix(3, initial_weights=[0.0, 1.0])
    layers = random_layers()
    with pytest.raises(ValueError, match="built for 2 layers but got 3"):
        ScalarMix(2)(layers)
    with pytest.raises(ValueError, match="share one shape"):
        ScalarMix(3)([layers[0], layers[1], layers[2][:, :3]])
    with pytest.raises(ValueError, match="needs the mask"):
        ScalarMix(3, do_layer_norm=True)(layers)
    with pytest.raises(ValueError, match=r"mask must have shape \(4, 7\)"):
        ScalarMix(3, do_layer_norm=True)(layers, torch.ones(4, 6, dtype=torch.bool))
