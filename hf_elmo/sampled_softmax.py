"""Sampled softmax with the log-uniform (Zipfian) candidate sampler, as TensorFlow's `sampled_softmax_loss`.

bilm-tf trains its word softmax with `tf.nn.sampled_softmax_loss(..., num_true=1)` and the default sampler
(`log_uniform_candidate_sampler`, `unique=True`). This module reproduces that estimator:

* `num_samples` distinct candidate words are drawn once and shared by every target of the call. Draws are
  with replacement from `Q(k) = log((k + 2) / (k + 1)) / log(V + 1)` and repeated until `num_samples`
  distinct words are seen; `num_tries` counts all draws, duplicates included.
* The expected number of times a word appears in the sample is `1 - (1 - Q(k)) ** num_tries`
  (`num_samples * Q(k)` when no draw was a duplicate), for the sampled words and for each true word.
* Logits are corrected by subtracting the log of that expected count ("log-Q correction").
* A sampled word equal to a row's true word ("accidental hit") is removed from that row's softmax.
* The loss of a row is the cross-entropy of `[true logit, sampled logits]` with the true one as the label.

The log-uniform distribution assumes word ids sorted by descending frequency, which is the order of the
vocabulary files.
"""

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F

from .cpu_kernels import available as compiled_loops_available
from .cpu_kernels import logsumexp_rows as compiled_logsumexp
from .cpu_kernels import logsumexp_rows_backward as compiled_logsumexp_backward
from .input_checks import direction_rows
from .triton_support import INTERPRETED as KERNELS_INTERPRETED

try:  # Triton ships with PyTorch's CUDA builds; without it the sampled softmax uses PyTorch operations.
    from .sampled_softmax_triton import logsumexp_backward, logsumexp_forward
except ImportError:  # pragma: no cover - depends on the installation
    logsumexp_forward = None


def log_uniform_probability(word_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`Q(k) = log((k + 2) / (k + 1)) / log(V + 1)` in float64, same shape as `word_ids`."""
    k = word_ids.to(torch.float64)
    return torch.log1p(1.0 / (k + 1.0)) / math.log(vocab_size + 1.0)


def sample_log_uniform_candidates(
    num_samples: int, vocab_size: int, generator: torch.Generator | None = None
) -> tuple[torch.LongTensor, int]:
    """Draw from `Q` with replacement until `num_samples` distinct words are seen (TensorFlow's unique sampler).

    Returns:
        `(sampled, num_tries)`: the distinct words `(num_samples,)` in order of first appearance, on the CPU, and
        the number of draws it took, duplicates included.
    """
    if not 0 < num_samples <= vocab_size:
        raise ValueError(f"num_samples must be in [1, vocab_size={vocab_size}], got {num_samples}.")
    log_range = math.log(vocab_size + 1.0)
    seen = torch.zeros(vocab_size, dtype=torch.bool)
    sampled, num_tries = [], 0
    missing = num_samples
    while missing:
        # Several draws per missing word at once: the head of the distribution repeats a lot.
        chunk = max(2 * missing, 1024)
        uniform = torch.rand(chunk, dtype=torch.float64, generator=generator)
        draws = (torch.exp(uniform * log_range).long() - 1).clamp_(0, vocab_size - 1)
        values, inverse = torch.unique(draws, return_inverse=True)
        first_position = torch.full_like(values, chunk).scatter_reduce_(0, inverse, torch.arange(chunk), reduce="amin")
        new = ~seen[values]
        positions, order = first_position[new].sort()
        new_values = values[new][order]
        if len(new_values) >= missing:
            # Stop at the draw that completes the sample, as sequential sampling would.
            num_tries += int(positions[missing - 1]) + 1
            new_values = new_values[:missing]
        else:
            num_tries += chunk
        seen[new_values] = True
        sampled.append(new_values)
        missing -= len(new_values)
    return torch.cat(sampled), num_tries


# A device sample draws at most this many candidates at once (a float64 and an int64 value each).
_MAX_DEVICE_DRAWS = 1 << 22


@functools.lru_cache(maxsize=64)
def _draws_for_unique_sample(num_samples: int, vocab_size: int) -> int | None:
    """Enough draws from `Q` to see `num_samples` distinct words but with probability below `exp(-50)` (2e-22),
    or None when that is more than `_MAX_DEVICE_DRAWS`.

    Whether each word is among `m` draws are negatively associated events, so Chernoff's bounds hold for their
    count `X` (mean `mu = sum_k 1 - (1 - Q(k)) ** m`) and for the count of words not drawn, `V - X` (mean
    `nu = V - mu`): `P(X < n) <= exp(-(mu - n) ** 2 / (2 mu))`, and with `a = V - n + 1 = nu (1 + d)`,
    `P(V - X >= a) <= exp(-d ** 2 nu / (2 + d))`, and Markov's `P(V - X >= a) <= nu / a`. The last two are the
    tight ones when the sample is most of the vocabulary. Returns the smallest `m` (to 0.1%) for which either bound
    is below `exp(-50)`.
    """
    log_q = np.log1p(-np.log1p(1.0 / np.arange(1.0, vocab_size + 1.0)) / math.log(vocab_size + 1.0))
    not_drawn_needed = vocab_size - num_samples + 1

    def enough(draws: int) -> bool:
        not_drawn = float(np.exp(draws * log_q).sum())
        drawn = vocab_size - not_drawn
        if drawn > num_samples and (drawn - num_samples) ** 2 / (2 * drawn) >= 50:
            return True
        if not_drawn * math.exp(50) <= not_drawn_needed:  # Markov: P(V - X >= a) <= nu / a
            return True
        if not_drawn < not_drawn_needed:
            excess = not_drawn_needed / not_drawn - 1
            return (not_drawn_needed - not_drawn) * excess / (2 + excess) >= 50
        return False

    low, high = num_samples, num_samples
    while not enough(high):
        if high > _MAX_DEVICE_DRAWS:
            return None
        low, high = high, 2 * high
    while high - low > max(1, low // 1000):
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high if high <= _MAX_DEVICE_DRAWS else None


def sample_log_uniform_candidates_on_device(
    num_samples: int, vocab_size: int, device: torch.device, generator: torch.Generator | None = None
) -> tuple[torch.LongTensor, torch.LongTensor] | None:
    """`sample_log_uniform_candidates` computed on `device` without waiting for it: a fixed number of draws that
    holds `num_samples` distinct words but with probability below 2e-22 (see `_draws_for_unique_sample`), of
    which the first `num_samples` distinct ones, in order of first appearance, are the sample, as a sequential
    sampler stopping there would give.

    Returns:
        `(sampled, num_tries)` on `device`: `(num_samples,)` word ids and the number of draws up to the last of
        them, a 0-d tensor; or None when a sample would need too many draws (then draw on the CPU).
    """
    if not 0 < num_samples <= vocab_size:
        raise ValueError(f"num_samples must be in [1, vocab_size={vocab_size}], got {num_samples}.")
    num_draws = _draws_for_unique_sample(num_samples, vocab_size)
    if num_draws is None:
        return None
    uniform = torch.rand(num_draws, dtype=torch.float64, device=device, generator=generator)
    draws = (torch.exp(uniform * math.log(vocab_size + 1.0)).long() - 1).clamp_(0, vocab_size - 1)
    return first_distinct(draws, num_samples, vocab_size)


def first_distinct(
    draws: torch.LongTensor, num_samples: int, vocab_size: int
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """The first `num_samples` distinct values of `draws` `(M,)` (ids in `[0, vocab_size)`), in order of first
    appearance, and `1 +` the position where the last of them first appears (0-d tensor), computed without
    a loop: each id's first position by a scatter-min, then sorted. `draws` must hold that many distinct ids."""
    positions = torch.arange(len(draws), device=draws.device)
    first_draw = torch.full((vocab_size,), len(draws), device=draws.device)
    first_draw, words = first_draw.scatter_reduce_(0, draws, positions, "amin").sort(stable=True)
    return words[:num_samples], first_draw[num_samples - 1] + 1


def expected_count(probability: torch.Tensor, num_samples: int, num_tries: int | torch.Tensor) -> torch.Tensor:
    """Expected occurrences of a word of probability `Q` in a unique sample that took `num_tries` draws."""
    if isinstance(num_tries, torch.Tensor):
        return torch.where(
            num_tries == num_samples, probability * num_samples, -torch.expm1(num_tries * torch.log1p(-probability))
        )
    if num_tries == num_samples:
        return probability * num_samples
    return -torch.expm1(num_tries * torch.log1p(-probability))


def sampled_softmax_loss(
    hidden: torch.Tensor,
    targets: torch.LongTensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    num_samples: int,
    sampled: torch.LongTensor | None = None,
    num_tries: int | None = None,
    generator: torch.Generator | None = None,
    kernel: str | None = None,
) -> torch.Tensor:
    """Per-target sampled-softmax cross-entropy.

    Args:
        hidden: `(N, P)` inputs of the softmax.
        targets: `(N,)` true word ids in `[0, V)`.
        weight: `(V, P)` and bias `(V,)`: the full softmax.
        num_samples: distinct negative candidates shared by all `N` targets.
        sampled, num_tries: a sample from `sample_log_uniform_candidates` to use instead of drawing one.
        generator: random generator of the draw (default: torch's global generator of the device that draws: the
            CPU's for CPU tensors and for a CPU `generator`, else `hidden`'s device, which then never waits).
        kernel: the log-sum-exp over the sample, a model's resolved `paths.sampled_softmax`: "compiled" (the CPU
            loops), "triton" (one fused pass each way) or "torch"; by default as a model on `hidden` resolves it.

    Returns:
        `(N,)` losses, in float32 or float64 (the precision of `hidden`, at least float32).
    """
    vocab_size = weight.shape[0]
    device = hidden.device
    if sampled is None and device.type != "cpu" and (generator is None or generator.device == device):
        drawn = sample_log_uniform_candidates_on_device(num_samples, vocab_size, device, generator)
        if drawn is not None:
            sampled, num_tries = drawn
    if sampled is None:
        sampled, num_tries = sample_log_uniform_candidates(num_samples, vocab_size, generator)
    sampled = sampled.to(device)
    true_log_q = torch.log(expected_count(log_uniform_probability(targets, vocab_size), num_samples, num_tries))
    sampled_log_q = torch.log(expected_count(log_uniform_probability(sampled, vocab_size), num_samples, num_tries))

    # The targets' and the sample's rows in one `index_select` each: its backward zeroes one `(V, P)` gradient and
    # scatter-adds into it (indexing's sorts the indices first, `embedding`'s waits for the GPU to count them), where
    # a gather each zeroed two and added them up.
    rows = torch.cat([targets, sampled])
    true_weight, sampled_weight = weight.index_select(0, rows).split([len(targets), num_samples])
    true_bias, sampled_bias = bias.index_select(0, rows).split([len(targets), num_samples])
    true_logits = (hidden * true_weight).sum(-1) + true_bias
    # The log-Q correction goes into the product's bias: one pass over the (N, S) logits less.
    sampled_bias = (sampled_bias - sampled_log_q).to(hidden.dtype)
    # Accidental hits: the sampled word equal to a row's target, at most one per row (the sample is distinct),
    # is removed from that row's softmax.
    position_in_sample = torch.full((vocab_size,), num_samples, device=device)
    position_in_sample[sampled] = torch.arange(num_samples, device=device)
    hit = position_in_sample[targets]  # num_samples where the target was not sampled
    # The softmax runs in at least float32 even under bf16 autocast.
    compute_dtype = torch.promote_types(true_logits.dtype, torch.float32)
    true_logits = true_logits.to(compute_dtype) - true_log_q.to(compute_dtype)
    if kernel is None:
        kernel = _kernel_for(hidden)
    if device.type == "cpu" and hidden.dtype in (torch.float32, torch.float64) and not torch.is_autocast_enabled("cpu"):
        sampled_total = _SampledLogSumExp.apply(hidden, sampled_weight, sampled_bias, hit, kernel == "compiled")
    else:
        sampled_logits = torch.addmm(sampled_bias, hidden, sampled_weight.t())
        sampled_total = logsumexp_without(sampled_logits, hit, fused=kernel == "triton").to(compute_dtype)
    return torch.logaddexp(true_logits, sampled_total) - true_logits


def _kernel_for(hidden: torch.Tensor) -> str:
    """The sampled log-sum-exp's kernel for a call outside a model, as `paths_resolution.resolve` chooses it: the
    compiled loops for float32 CPU tensors, one fused Triton pass for 16- and 32-bit CUDA tensors (CPU tensors only
    under Triton's interpreter, where asked for)."""
    if hidden.dtype == torch.float32 and not torch.is_autocast_enabled("cpu") and compiled_loops_available(hidden):
        return "compiled"
    fused = logsumexp_forward is not None and not KERNELS_INTERPRETED
    return "triton" if fused and hidden.is_cuda and hidden.dtype != torch.float64 else "torch"


def logsumexp_without(logits: torch.Tensor, skip: torch.LongTensor, fused: bool = False) -> torch.Tensor:
    """`(N, S)` logits, `(N,)` a column per row to leave out (`S`: none) -> `(N,)` log-sum-exp of the others, in at
    least float32. `fused`: one Triton pass forward and one backward (`sampled_softmax_triton.py`)."""
    if fused:
        return _LogSumExpWithout.apply(logits.contiguous(), skip.contiguous())
    columns = logits.shape[1]
    has_skip = (skip < columns)[:, None]
    skip = skip.clamp(max=columns - 1)[:, None]
    logits = logits.scatter(1, skip, torch.where(has_skip, float("-inf"), logits.gather(1, skip)))
    return torch.logsumexp(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=1)


class _LogSumExpWithout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, skip):
        result = logsumexp_forward(logits, skip)
        ctx.save_for_backward(logits, skip, result)
        return result

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        logits, skip, result = ctx.saved_tensors
        return logsumexp_backward(logits, skip, result, grad), None


class _SampledLogSumExp(torch.autograd.Function):
    """`logsumexp_without(hidden @ weight.T + bias, skip)` on CPUs, `(N, P)`, `(S, P)`, `(S,)`, `(N,)` -> `(N,)`, with
    the `(N, S)` logits formed once, masked in place and turned into their gradient in place: three passes over
    them in each direction instead of a copy, a scatter and autograd's log-sum-exp; in float32 the log-sum-exp and
    its gradient are one pass each where `compiled` (`cpu_kernels.py`)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, skip, compiled):
        logits = torch.addmm(bias, hidden, weight.t())
        hits = (skip < logits.shape[1]).nonzero().squeeze(1)
        logits[hits, skip[hits]] = float("-inf")
        total = compiled_logsumexp(logits) if compiled else torch.logsumexp(logits, dim=1)
        ctx.save_for_backward(hidden, weight, logits, total)
        ctx.compiled = compiled
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        hidden, weight, logits, total = ctx.saved_tensors
        # Softmax times the incoming gradient; the left-out column has exp(-inf) = 0.
        if ctx.compiled:
            grad_logits = compiled_logsumexp_backward(logits, total, grad)
        else:
            grad_logits = torch.sub(logits, total[:, None]).exp_().mul_(grad[:, None])
        grad_hidden = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_hidden = torch.mm(grad_logits, weight)
        if ctx.needs_input_grad[1]:
            grad_weight = torch.mm(grad_logits.t(), hidden)
        if ctx.needs_input_grad[2]:
            grad_bias = grad_logits.sum(dim=0)
        return grad_hidden, grad_weight, grad_bias, None, None


def full_softmax_loss(
    hidden: torch.Tensor, targets: torch.LongTensor, weight: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """Per-target cross-entropy of the full softmax: `(N, P)` hidden, `(N,)` targets -> `(N,)` losses."""
    logits = F.linear(hidden, weight, bias)
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets, reduction="none")


def bilm_loss_sums(
    top: torch.Tensor,
    labels: torch.Tensor,
    softmax: torch.nn.Linear,
    num_samples: int | None,
    split_directions=False,
    kernel: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(B, T, 2P)` top layer (after dropout) and `(B, T, 2)` labels -> the summed cross-entropy `(2,)` and the
    number of targets `(2,)` of the forward and the backward LM (with `split_directions`, of the forward LM on the
    first half of the rows and the backward LM on the second), through the sampled softmax with `num_samples` (its
    log-sum-exp on `kernel`, see `sampled_softmax_loss`), else the full one."""
    forward_rows, backward_rows = direction_rows(len(top), split_directions)
    forward_hidden, backward_hidden = top[forward_rows].chunk(2, dim=-1)[0], top[backward_rows].chunk(2, dim=-1)[1]
    hidden = torch.cat([forward_hidden.flatten(0, 1), backward_hidden.flatten(0, 1)])  # (2 B' T, P)
    targets = torch.cat([labels[forward_rows, :, 0].flatten(), labels[backward_rows, :, 1].flatten()]).long()
    has_target = targets != -100
    # Every position is scored and the ones without a target are dropped from the sums: shapes then do not
    # depend on the data, so a GPU never waits for the host to count targets.
    targets = targets.masked_fill(~has_target, 0)
    scored = None
    if hidden.device.type == "cpu":  # where the host knows the targets anyway, only positions that have one
        scored = has_target.nonzero().squeeze(1)
        hidden, targets = hidden.index_select(0, scored), targets.index_select(0, scored)
    if num_samples:
        losses = sampled_softmax_loss(hidden, targets, softmax.weight, softmax.bias, num_samples, kernel=kernel)
    else:
        losses = full_softmax_loss(hidden, targets, softmax.weight, softmax.bias)
    if scored is not None:
        losses = losses.new_zeros(has_target.shape).index_copy(0, scored, losses)
    sums = torch.where(has_target, losses, 0.0).view(2, -1).sum(dim=1)
    return sums, has_target.view(2, -1).sum(dim=1)


__all__ = [
    "bilm_loss_sums",
    "expected_count",
    "full_softmax_loss",
    "log_uniform_probability",
    "logsumexp_without",
    "sample_log_uniform_candidates",
    "sample_log_uniform_candidates_on_device",
    "sampled_softmax_loss",
]
