"""TensorFlow's sampled softmax with the log-uniform sampler: the loss and its gradients against the float64 formula,
the expected counts, the sampler's draws and frequencies, the limit of the full softmax.
"""

import math

import numpy as np
import pytest
import torch

from hf_elmo import cpu_kernels, sampled_softmax
from hf_elmo.sampled_softmax import full_softmax_loss, sample_log_uniform_candidates, sampled_softmax_loss


@pytest.fixture(params=["compiled log-sum-exp", "PyTorch log-sum-exp"])
def loops(request, monkeypatch):
    """The CPU path's float32 log-sum-exp and its gradient as compiled loops (where they build) or PyTorch's."""
    if request.param.startswith("PyTorch"):
        monkeypatch.setattr(sampled_softmax, "compiled_loops_available", lambda tensor: False)
    elif not cpu_kernels.available(torch.zeros(1)):
        pytest.skip("the compiled CPU loops do not build here")


def reference_sampled_softmax(hidden, targets, weight, bias, sampled, num_tries):
    """TensorFlow's `sampled_softmax_loss` (log-uniform sampler, unique, accidental hits removed) written out
    in float64 numpy, one target at a time."""
    vocab_size, num_samples = weight.shape[0], len(sampled)

    def log_expected_count(word):
        q = math.log((word + 2) / (word + 1)) / math.log(vocab_size + 1)
        count = q * num_samples if num_tries == num_samples else 1.0 - (1.0 - q) ** num_tries
        return math.log(count)

    losses = []
    for h, t in zip(hidden, targets):
        true_logit = h @ weight[t] + bias[t] - log_expected_count(t)
        logits = [true_logit] + [h @ weight[s] + bias[s] - log_expected_count(s) for s in sampled if s != t]
        top = max(logits)
        losses.append(top + math.log(sum(math.exp(x - top) for x in logits)) - true_logit)
    return np.array(losses)


def random_softmax(vocab_size, dim, n, seed=0):
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(n, dim))
    weight = rng.normal(size=(vocab_size, dim)) / math.sqrt(dim)
    bias = rng.normal(size=vocab_size)
    # Zipf-like targets, so that some of them are sampled as negatives (accidental hits).
    targets = np.minimum(rng.zipf(1.3, size=n) - 1, vocab_size - 1)
    return hidden, targets, weight, bias


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_matches_float64_formula(dtype, tolerance, loops):
    hidden, targets, weight, bias = random_softmax(vocab_size=60, dim=8, n=40)
    generator = torch.Generator().manual_seed(0)
    sampled, num_tries = sample_log_uniform_candidates(12, 60, generator)
    assert num_tries > 12, "the head of the distribution should repeat, exercising the unique-sampling counts"
    assert set(targets.tolist()) & set(sampled.tolist()), "no accidental hit: the test would not exercise removal"
    expected = reference_sampled_softmax(hidden, targets, weight, bias, sampled.tolist(), num_tries)
    as_tensor = lambda a: torch.tensor(a, dtype=dtype)  # noqa: E731
    actual = sampled_softmax_loss(
        as_tensor(hidden), torch.tensor(targets), as_tensor(weight), as_tensor(bias), 12, sampled, num_tries
    )
    np.testing.assert_allclose(actual.double().numpy(), expected, rtol=tolerance, atol=tolerance)


def test_no_duplicate_draws_uses_linear_expected_count():
    # A range equal to the sample size can only finish without duplicates by luck; a huge vocabulary with a
    # sample of 1 always does: then the expected count is num_samples * Q.
    hidden, targets, weight, bias = random_softmax(vocab_size=1000, dim=4, n=5)
    sampled, num_tries = sample_log_uniform_candidates(1, 1000, torch.Generator().manual_seed(3))
    assert num_tries == 1
    expected = reference_sampled_softmax(hidden, targets, weight, bias, sampled.tolist(), num_tries)
    actual = sampled_softmax_loss(*map(torch.tensor, (hidden, targets, weight, bias)), 1, sampled, num_tries)
    np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-12)


def test_sampler_draws_distinct_words_in_range():
    generator = torch.Generator().manual_seed(1)
    for vocab_size, num_samples in [(10, 10), (100, 30), (5000, 2000)]:
        sampled, num_tries = sample_log_uniform_candidates(num_samples, vocab_size, generator)
        assert len(sampled) == len(set(sampled.tolist())) == num_samples
        assert 0 <= int(sampled.min()) and int(sampled.max()) < vocab_size
        assert num_tries >= num_samples
    with pytest.raises(ValueError, match="num_samples must be in"):
        sample_log_uniform_candidates(11, 10)


def test_sampler_frequencies_follow_log_uniform():
    # The first draw of each sample is a plain draw from Q: its frequency over many samples estimates Q.
    generator = torch.Generator().manual_seed(2)
    vocab_size, runs = 20, 4000
    first = torch.cat([sample_log_uniform_candidates(1, vocab_size, generator)[0] for _ in range(runs)])
    frequency = torch.bincount(first, minlength=vocab_size).double() / runs
    k = torch.arange(vocab_size, dtype=torch.float64)
    q = torch.log((k + 2) / (k + 1)) / math.log(vocab_size + 1)
    # 4 binomial standard deviations
    assert torch.all((frequency - q).abs() <= 4 * torch.sqrt(q * (1 - q) / runs))


def test_approaches_full_softmax_as_samples_grow():
    vocab_size = 200
    hidden, targets, weight, bias = (torch.tensor(a) for a in random_softmax(vocab_size, dim=16, n=64, seed=4))
    full = full_softmax_loss(hidden, targets, weight, bias).mean().item()
    generator = torch.Generator().manual_seed(5)
    errors = []
    for num_samples in (10, 40, 120, vocab_size - 1):
        losses = [
            sampled_softmax_loss(hidden, targets, weight, bias, num_samples, generator=generator).mean().item()
            for _ in range(10)
        ]
        errors.append(abs(np.mean(losses) - full))
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    # With all but one word sampled, the only differences left are one missing word and the log-Q
    # correction of the rarest words, whose expected counts are a little below 1.
    assert errors[-1] < 0.01 * full, (errors, full)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_gradients_match_autograd_of_the_formula(dtype, tolerance, loops):
    """The CPU path forms, masks and differentiates the sampled logits in place; its gradients are autograd's of
    the formula written with plain operations in float64."""
    hidden, targets, weight, bias = random_softmax(vocab_size=60, dim=8, n=40, seed=1)
    sampled, num_tries = sample_log_uniform_candidates(12, 60, torch.Generator().manual_seed(0))
    assert set(targets.tolist()) & set(sampled.tolist()), "no accidental hit: the test would not exercise removal"
    grad = torch.from_numpy(np.random.default_rng(2).normal(size=len(targets)))
    tensors = [torch.tensor(a, dtype=dtype, requires_grad=True) for a in (hidden, weight, bias)]
    sampled_softmax_loss(*tensors[:1], torch.tensor(targets), *tensors[1:], 12, sampled, num_tries).backward(
        grad.to(dtype)
    )

    h, w, b = (torch.tensor(a, requires_grad=True) for a in (hidden, weight, bias))
    t = torch.tensor(targets)
    q = lambda k: torch.log1p(1.0 / (k.double() + 1.0)) / math.log(60 + 1.0)  # noqa: E731
    log_count = lambda k: torch.log(-torch.expm1(num_tries * torch.log1p(-q(k))))  # noqa: E731
    true_logits = (h * w[t]).sum(-1) + b[t] - log_count(t)
    logits = h @ w[sampled].t() + b[sampled] - log_count(sampled)
    logits = logits.masked_fill(t[:, None] == sampled[None, :], float("-inf"))
    losses = torch.logaddexp(true_logits, torch.logsumexp(logits, dim=1)) - true_logits
    losses.backward(grad)
    for actual, expected in zip(tensors, (h, w, b)):
        scale = expected.grad.abs().max()
        assert (actual.grad.double() - expected.grad).abs().max() <= tolerance * scale
