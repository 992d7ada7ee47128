"""Held-out perplexity of a trained biLM, per direction, with the full softmax.

Three ways to run the held-out text through the model:

- windows (the default): sentences packed into windows exactly as for training (see `windows`), each window
  starting from the model's start state (its warm start state, else zeros);
- `--stream`: bilm-tf's `test()`, exactly: one continuous stream per batch row, the state never reset, the last
  incomplete batch dropped (see `streams_bilm`);
- `--start zero|warm`: every line scored on its own from the zero or the warm start state.

The forward perplexity is `exp` of the mean cross-entropy of the forward LM over its targets (each sentence's words
and `</S>`), the backward one likewise (`<S>` and the words); the combined one, which bilm-tf prints, is their
geometric mean, `exp` of the mean of the two losses (39.7 for the released model on the 1B Word Benchmark).
`--stream` and `--start` read every line as a sentence, a blank line as an empty one, as bilm-tf does; the windows
skip blank lines.
"""

import itertools
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..character_rows import EOS_TOKEN
from ..configuration_elmo import ElmoConfig
from ..modeling_elmo import ElmoForBiLM
from ..sampled_softmax import full_softmax_loss
from ..tokenization_elmo import ElmoTokenizer
from ..word_vocabulary import BOS_WORD_INDEX
from .collator import DataCollatorForBiLM
from .corpus import check_text_files, iter_sentences
from .streams import build_streams, stream_input_ids
from .windows import encode_windows, pack_sentences

STARTS = ("zero", "warm")


def _batches(files, tokenizer, window, split, batch_size):
    groups = pack_sentences(iter_sentences(files, split, tokenizer), window)
    collate = DataCollatorForBiLM()
    rows = []  # a group holding a sentence longer than the window encodes as several windows
    while chunk := list(itertools.islice(groups, batch_size)):
        encoded = encode_windows(chunk, tokenizer, window)
        rows += [{"input_ids": ids, "labels": labels} for ids, labels in zip(encoded["input_ids"], encoded["labels"])]
        while len(rows) >= batch_size:
            yield collate(rows[:batch_size])
            rows = rows[batch_size:]
    if rows:
        yield collate(rows)


def _check_vocabulary(model: ElmoForBiLM, tokenizer: ElmoTokenizer):
    if tokenizer.word_vocabulary is None:
        raise ValueError("The tokenizer has no word vocabulary: perplexity needs the one the model was trained with.")
    if len(tokenizer.word_vocabulary) != model.config.vocab_size:
        raise ValueError(
            f"The tokenizer's vocabulary has {len(tokenizer.word_vocabulary)} words but the model's softmax "
            f"{model.config.vocab_size}."
        )


def _result(sums: torch.Tensor, counts: torch.Tensor) -> dict[str, float]:
    forward, backward = torch.exp(sums / counts).tolist()
    return {
        "forward": forward,
        "backward": backward,
        "geometric_mean": math.sqrt(forward * backward),
        "targets": int(counts[0]),
    }


@torch.no_grad()
def stream_perplexity(
    model: ElmoForBiLM,
    tokenizer: ElmoTokenizer,
    files: Sequence[str],
    batch_size: int = 64,
    split: str = "whitespace",
    return_token_nll: bool = False,
) -> dict:
    """bilm-tf's `test()`: perplexity of `files` read as `batch_size` continuous streams (see `streams_bilm`).

    Every stream starts from the zero state, as bilm-tf's; the state is never reset. Each batch scores one position
    of every row; the first batch that some row cannot fill is dropped, with everything after it.

    Returns:
        `{"forward", "backward", "geometric_mean" (bilm-tf's combined perplexity), "targets"}` (`targets`
        predictions per direction, `batch_size` per batch) and, with `return_token_nll`, `"forward_nll"` and
        `"backward_nll"`: `(batches, batch_size)` float32 arrays of every prediction's cross-entropy, in each
        direction's reading order, and their targets `"forward_targets"`, `"backward_targets"`.
    """
    _check_vocabulary(model, tokenizer)
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}.")
    files = check_text_files(files, "evaluation")
    sentences = list(iter_sentences(files, split, tokenizer, blank_lines=True))
    if len(sentences) < batch_size:  # before the streams are laid out: the first batch takes a line per row
        raise ValueError(
            f"{len(sentences)} lines cannot fill one batch of {batch_size} streams: every row needs a line of its own "
            "(use a smaller --batch-size)."
        )
    streams = build_streams(sentences, tokenizer, batch_size, num_steps=1)
    char_ids = tokenizer.characters.rows(streams.words)
    model.eval()
    device, rows, length = model.device, streams.batch_size, streams.length
    projection_dim, vocab_size = model.config.projection_dim, model.config.vocab_size
    # Positions per model call: long enough to keep the recurrence busy, short enough for the logits.
    chunk = max(1, min(512, 2**22 // (rows * vocab_size)))
    state = model.elmo.initial_state(2 * rows, warm=False)
    nll = torch.empty(2, rows, length, dtype=torch.float32)
    for start in range(0, length, chunk):
        end = min(start + chunk, length)
        input_ids = stream_input_ids(streams, char_ids, start, end).to(device)
        out = model(input_ids, state=state, use_cache=True, split_directions=True)
        state = out.state
        top = out.last_hidden_state
        hidden = (top[:rows, :, :projection_dim], top[rows:, :, projection_dim:].flip(1))
        targets = (streams.forward_targets[:, start:end], streams.backward_targets[:, start:end])
        for direction in range(2):
            losses = full_softmax_loss(
                hidden[direction].flatten(0, 1),
                torch.from_numpy(targets[direction]).flatten().to(device),
                model.softmax.weight,
                model.softmax.bias,
            )
            nll[direction, :, start:end] = losses.view(rows, end - start).float().cpu()
    sums = nll.double().sum(dim=(1, 2))
    result = _result(sums, torch.full((2,), float(rows * length), dtype=torch.float64))
    if return_token_nll:
        result["forward_nll"], result["backward_nll"] = (nll[d].T.numpy() for d in range(2))
        result["forward_targets"], result["backward_targets"] = streams.forward_targets.T, streams.backward_targets.T
    return result


@torch.no_grad()
def sentence_perplexity(
    model: ElmoForBiLM,
    tokenizer: ElmoTokenizer,
    files: Sequence[str],
    start: str = "zero",
    batch_size: int = 64,
    split: str = "whitespace",
) -> dict[str, float]:
    """Perplexity of `files` with every line scored on its own from the `"zero"` or the `"warm"` start state.

    Each line `w_1 .. w_n` gives `n + 1` predictions per direction (`w_1 .. w_n </S>` forward, `<S> w_1 .. w_n`
    backward), all lines counted (a blank line as an empty sentence), so that the numbers compare with
    `stream_perplexity` at batch size 1, which scores the same predictions with the state carried along.
    """
    _check_vocabulary(model, tokenizer)
    if start not in STARTS:
        raise ValueError(f"start must be one of {STARTS}, got {start!r}.")
    if start == "warm" and model.elmo.warm_state is None:
        raise ValueError(
            "This model has no warm start state: estimate one with "
            "`hf-elmo warm-state --model DIR --in-place TEXT_FILE`."
        )
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}.")
    files = check_text_files(files, "evaluation")
    sentences = list(iter_sentences(files, split, tokenizer, blank_lines=True))
    # Results do not depend on the batch (a row's numbers are its own): batches of similar lengths pad least.
    order = sorted(range(len(sentences)), key=lambda k: len(sentences[k]))
    model.eval()
    collate = DataCollatorForBiLM()
    sums = torch.zeros(2, dtype=torch.float64)
    counts = torch.zeros(2, dtype=torch.float64)
    for first in range(0, len(order), batch_size):
        windows = [[sentences[k]] for k in order[first : first + batch_size]]
        encoded = encode_windows(windows, tokenizer)
        batch = collate(
            [{"input_ids": ids, "labels": labels} for ids, labels in zip(encoded["input_ids"], encoded["labels"])]
        )
        batch = {k: v.to(model.device) for k, v in batch.items()}
        out = model(**batch, state=model.elmo.initial_state(len(windows), warm=start == "warm"))
        count = batch["labels"].ne(-100).sum(dim=(0, 1)).double().cpu()
        sums += torch.stack([out.forward_loss, out.backward_loss]).double().cpu() * count
        counts += count
    return _result(sums, counts)


@torch.no_grad()
def compute_perplexity(
    model: ElmoForBiLM,
    tokenizer: ElmoTokenizer,
    files: Sequence[str],
    window: int = 20,
    split: str = "whitespace",
    batch_size: int = 64,
) -> dict[str, float]:
    """Forward, backward and geometric-mean perplexity of `files` (one sentence per line) under `model`.

    Returns:
        `{"forward": ..., "backward": ..., "geometric_mean": ..., "targets": n}`; `n` targets per direction.
    """
    _check_vocabulary(model, tokenizer)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    if window < 3:
        raise ValueError(f"window must be >= 3 positions (<S>, one word, </S>), got {window}.")
    files = check_text_files(files, "evaluation")
    model.eval()
    device = model.device
    sums = torch.zeros(2, dtype=torch.float64)
    counts = torch.zeros(2, dtype=torch.float64)
    for batch in _batches(files, tokenizer, window, split, batch_size):
        batch = {k: v.to(device) for k, v in batch.items()}
        out = model(**batch)
        count = batch["labels"].ne(-100).sum(dim=(0, 1)).double().cpu()
        sums += torch.stack([out.forward_loss, out.backward_loss]).double().cpu() * count
        counts += count
    return _result(sums, counts)


def unigram_perplexity(
    tokenizer: ElmoTokenizer, train_files: Sequence[str], files: Sequence[str], split: str = "whitespace"
) -> dict[str, float]:
    """Baseline: perplexity of `files` under a unigram model of the targets of `train_files`.

    The unigram model counts the training targets of each direction (words and `</S>` forward, `<S>` and words
    backward; out-of-vocabulary words as `<UNK>`) with add-one smoothing over the vocabulary.
    """
    vocabulary_size = len(tokenizer.word_vocabulary)

    def targets(paths):
        forward, backward = [], []
        for words in iter_sentences(check_text_files(paths), split, tokenizer):
            ids = tokenizer.word_targets([*words, EOS_TOKEN]).tolist()
            forward += ids
            backward += [BOS_WORD_INDEX] + ids[:-1]
        return {"forward": forward, "backward": backward}

    train, held_out = targets(train_files), targets(files)
    result = {}
    for direction in ("forward", "backward"):
        counts = np.bincount(train[direction], minlength=vocabulary_size) + 1.0
        log_probability = np.log(counts / counts.sum())[held_out[direction]]
        result[direction] = math.exp(-log_probability.mean())
    return result


def load_bilm(model_dir: str, device: str = "cpu") -> tuple[ElmoForBiLM, ElmoTokenizer]:
    """An `ElmoForBiLM` and its tokenizer (with word vocabulary) from a folder written by `hf-elmo train`."""
    if not (Path(model_dir) / "config.json").is_file():
        raise ValueError(f"{model_dir} has no config.json: expected a folder written by `hf-elmo train`.")
    config = ElmoConfig.from_pretrained(model_dir)
    if not config.vocab_size:
        raise ValueError(
            f"{model_dir} has no word softmax (config.vocab_size = 0), e.g. converted released weights, which come "
            "without it; perplexity needs a biLM trained or adapted with `hf-elmo train`."
        )
    tokenizer = ElmoTokenizer.from_pretrained(model_dir)
    words = tokenizer.word_vocabulary
    if words is None or len(words) != config.vocab_size:  # before the softmax of config.vocab_size rows is built
        raise ValueError(
            f"{model_dir}: the model's softmax has {config.vocab_size:,} words (config.json vocab_size) but its "
            f"vocabulary (vocab.txt) has {'none' if words is None else f'{len(words):,}'}."
        )
    model, info = ElmoForBiLM.from_pretrained(model_dir, output_loading_info=True)
    if info["missing_keys"]:
        raise ValueError(f"{model_dir}: the weights lack {sorted(info['missing_keys'])}; the softmax is needed.")
    return model.to(device), tokenizer


__all__ = ["compute_perplexity", "load_bilm", "sentence_perplexity", "stream_perplexity", "unigram_perplexity"]
