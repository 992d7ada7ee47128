"""The character CNN's fast paths (`paths.char_cnn`, `paths.window_max`, `paths.highway`): the computation of
`ElmoCharacterEncoder.forward`, exactly, with less work.

A word's slots after its last change of character (in practice its padding characters) hold one repeated character,
and every window lying inside that run gives the same value, one constant per filter and character: only the
windows up to a word's *span* are multiplied. "distinct_words" also computes each distinct word of the input once
(sorted by span and grouped, so that a long word does not make every short word's windows long); "every_word" runs
the same operations whatever the input, for GPUs, which would wait for the host to sort and group the words. The
max over a filter's windows is PyTorch's products (`torch`), the compiled CPU loop (`compiled`, `cpu_kernels.py`)
or one Triton kernel that never writes the `(words, windows, filters)` products (`triton`, `char_cnn_triton.py`).
Matrix products go to oneDNN as the resolved `paths.onednn` says, fewer of them in threads working side by side.
"""

from dataclasses import replace

import torch
import torch.nn.functional as F

from .character_rows import word_keys
from .cpu_kernels import WindowMax as CompiledWindowMax
from .cpu_threads import can_run_concurrently, run_concurrently
from .onednn_linear import linear
from .triton_support import triton

if triton is not None:
    from .char_cnn_triton import HighwayCombine, WindowMax

# Words are grouped by how many leading slots need real windows, rounded up to this many.
SPAN_GRANULARITY = 8
# Fewer distinct words than this per thread are not worth a second thread.
MIN_WORDS_PER_THREAD = 16


def char_cnn_forward(encoder, char_ids: torch.LongTensor, word_ids: torch.LongTensor | None, paths) -> torch.Tensor:
    """`ElmoCharacterEncoder.forward` on `paths.char_cnn`: `(..., C)` character ids (and `(...)` word ids with word
    embeddings) -> `(..., P)`; `paths` resolved."""
    batch_shape, num_chars = char_ids.shape[:-1], char_ids.shape[-1]
    words = char_ids.reshape(-1, num_chars)
    if paths.char_cnn == "every_word":
        # While a CUDA graph is captured the span cannot be read: every window, which the graph can replay anyway;
        # the fused window products stop at each block of words' longest span by themselves.
        capturing = words.is_cuda and torch.cuda.is_current_stream_capturing()
        longest = num_chars if capturing or paths.window_max == "triton" else int(_spans(words).max())
        features = _max_over_windows_of_group(encoder, words, longest, _run_values(encoder, words, paths), paths)
        per_token = _highways(encoder, features, paths)
    else:
        words, word_index = distinct_rows(words)
        spans, order = _spans(words).sort()
        words, spans = words[order], spans.tolist()
        embed = _embed_sorted_words
        if can_run_concurrently(words, paths.threads) and len(spans) >= 2 * MIN_WORDS_PER_THREAD:
            beside = replace(paths, onednn=paths.onednn and paths.onednn.beside_other_threads())
            # Every other word to each thread: both get as many short and long words.
            halves = run_concurrently(
                lambda: embed(encoder, words[0::2], spans[0::2], beside),
                lambda: embed(encoder, words[1::2], spans[1::2], beside),
            )
            per_word = halves[0].new_empty(len(spans), halves[0].shape[1])
            per_word[0::2], per_word[1::2] = halves
        else:
            per_word = embed(encoder, words, spans, paths)
        sorted_position = torch.empty_like(order)
        sorted_position[order] = torch.arange(len(order), device=order.device)
        per_token = per_word[sorted_position[word_index]]
        if encoder.word_embedding is None:  # projected once per distinct word
            return per_token.reshape(*batch_shape, -1)
    if encoder.word_embedding is not None:
        per_token = torch.cat([encoder.word_embedding(word_ids.reshape(-1)), per_token], dim=-1)
    projection = encoder.projection
    return linear(per_token, projection.weight, projection.bias, onednn=paths.onednn).reshape(*batch_shape, -1)


def highway_forward(layer, x: torch.Tensor, paths) -> torch.Tensor:
    """`ElmoHighwayLayer.forward` on `paths.highway`: its elementwise part as one Triton kernel each way, or as PyTorch
    operations after the product (through oneDNN where `paths.onednn` takes it)."""
    product = linear(x, layer.weight, layer.bias, onednn=paths.onednn)
    if paths.highway == "triton":
        with torch.autocast(x.device.type, enabled=False):
            combined = HighwayCombine.apply(product.reshape(-1, product.shape[-1]), x.reshape(-1, x.shape[-1]))
        return combined.view(x.shape)
    transformed, gate = product.chunk(2, dim=-1)
    transformed = F.relu(transformed)
    return torch.addcmul(transformed, torch.sigmoid(gate), x - transformed)


def _highways(encoder, features: torch.Tensor, paths) -> torch.Tensor:
    for layer in encoder.highways:
        features = highway_forward(layer, features, paths)
    return features


def _embed_sorted_words(encoder, words: torch.LongTensor, spans: list[int], paths) -> torch.Tensor:
    """`(U, C)` distinct words sorted by span, with their spans -> their token embeddings `(U, P)`, or their
    highway outputs `(U, F)` when word embeddings join them before the projection."""
    run_values = _run_values(encoder, words, paths)
    features = torch.cat(
        [
            _max_over_windows_of_group(encoder, words[start:end], span, [v[start:end] for v in run_values], paths)
            for start, end, span in _span_groups(spans, SPAN_GRANULARITY)
        ]
    )
    features = _highways(encoder, features, paths)
    if encoder.word_embedding is None:  # the projection depends on the characters only: once per distinct word
        return linear(features, encoder.projection.weight, encoder.projection.bias, onednn=paths.onednn)
    return features


def _run_values(encoder, words: torch.LongTensor, paths) -> list[torch.Tensor]:
    """A window inside a word's final run of one character: the kernel summed over its width times the run's
    character, `(U, n)` per filter."""
    final_char = encoder.char_embedding(words[:, -1])  # (U, e)
    return [linear(final_char, conv.weight.sum(dim=-1), onednn=paths.onednn) for conv in encoder.convolutions]


def _max_over_windows_of_group(encoder, words: torch.LongTensor, span: int, run_values, paths) -> torch.Tensor:
    """`(u, C)` words whose spans are at most `span` -> activated CNN features `(u, F)`."""
    num_chars = words.shape[1]
    max_width = max(conv.kernel_size[0] for conv in encoder.convolutions)
    chars = encoder.char_embedding(words[:, : min(span + max_width - 1, num_chars)])  # (u, L, e)
    fused = paths.window_max == "triton"
    if fused:
        autocast = torch.is_autocast_enabled(chars.device.type)
        chars = chars.to(torch.get_autocast_dtype(chars.device.type) if autocast else chars.dtype)
        spans = _spans(words)
    compiled = paths.window_max == "compiled"
    per_filter = []
    for conv, value in zip(encoder.convolutions, run_values):
        width = conv.kernel_size[0]
        num_windows = min(span, num_chars - width + 1)
        if num_windows > 0 and fused:
            weight = conv.weight.transpose(1, 2).reshape(conv.out_channels, -1).to(chars.dtype)  # (n, w e)
            with torch.autocast(chars.device.type, enabled=False):
                window_max = WindowMax.apply(chars, weight, num_windows, spans)
            # Each block of words stopped at its longest span: a word's windows from its own span on lie inside
            # its final run; where it has one, that run's value counts.
            has_run = (spans < num_chars - width + 1)[:, None]
            value = torch.where(has_run & ~(window_max > value), value, window_max)
        elif num_windows > 0:
            window_chars = chars[:, : num_windows + width - 1]
            if compiled:
                window_max = CompiledWindowMax.apply(window_chars, conv.weight, num_windows, paths.onednn)
            else:
                # max, not amax: its backward is one scatter (ties are identical windows, which give the weights
                # the same gradient whichever of them takes it). Matrix products of the windows rather than cuDNN's
                # convolutions: never rounded to TF32, and faster for these narrow inputs in bfloat16 too.
                windows = window_chars.unfold(1, width, 1)  # (u, windows, e, width)
                window_max = linear(windows.flatten(2), conv.weight.flatten(1), onednn=paths.onednn).max(dim=1).values
            # Windows from `span` on lie inside the final run; if the word has any, their value counts.
            if num_windows < num_chars - width + 1:
                # `where`, not `maximum`: cheaper backward, and a tie gives the weights the same gradient either way.
                window_max = torch.where(window_max > value, window_max, value)
            value = window_max
        per_filter.append(value)
    bias = torch.cat([conv.bias for conv in encoder.convolutions])
    # The bias and the activation commute with the max: rounding and both activations are monotonic.
    return encoder.activation(torch.cat(per_filter, dim=-1) + bias)


def distinct_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(N, C)` integers (character ids, or the bits of float rows) -> the distinct rows `(U, C)` and each row's index
    among them `(N,)`, as
    `torch.unique(rows, dim=0, return_inverse=True)` gives them but in another order and with far fewer operations:
    one key per row (`character_rows.word_keys`), a sort of the keys and an exact check that rows with one key are
    equal. Rows that share a key without being equal (a collision) fall back to the row-wise unique."""
    distinct_keys, index = torch.unique(word_keys(rows), return_inverse=True)
    first = torch.empty_like(distinct_keys).scatter_(0, index, torch.arange(len(rows), device=rows.device))
    distinct = rows.index_select(0, first)
    if not torch.equal(distinct.index_select(0, index), rows):
        return torch.unique(rows, dim=0, return_inverse=True)
    return distinct, index


def _spans(words: torch.LongTensor) -> torch.LongTensor:
    """`(U, C)` character ids -> `(U,)` slots up to the last one that differs from the final slot (0 when all
    slots hold one character): windows beyond a word's span see only its final run."""
    num_chars = words.shape[1]
    differs = words != words[:, -1:]
    return torch.where(differs, torch.arange(1, num_chars + 1, device=words.device), 0).amax(dim=1)


def _span_groups(spans: list[int], granularity: int) -> list[tuple[int, int, int]]:
    """Runs of ascending `spans` that round up to the same multiple of `granularity`: `(start, end, longest)`."""
    groups, start = [], 0
    for end in range(1, len(spans) + 1):
        rounded = (spans[start] + granularity - 1) // granularity
        if end == len(spans) or (spans[end] + granularity - 1) // granularity != rounded:
            groups.append((start, end, spans[end - 1]))
            start = end
    return groups
