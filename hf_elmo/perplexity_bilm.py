"""`hf-elmo perplexity`: held-out perplexity of a trained biLM, per direction, with the full softmax.

Sentences are packed into windows exactly as for training (see `data_bilm`), each window starting from a zero
state. The forward perplexity is `exp` of the mean cross-entropy of the forward LM over its targets (each
sentence's words and `</S>`), the backward one likewise (`<S>` and the words); the original reports their
geometric mean, `exp` of the mean of the two losses (39.7 for its released model on the 1B Word Benchmark).
"""

import argparse
import itertools
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .configuration_elmo import ElmoConfig
from .data_bilm import (
    SPLIT_HELP,
    SPLITS,
    DataCollatorForBiLM,
    check_text_files,
    encode_windows,
    iter_sentences,
    pack_sentences,
)
from .modeling_elmo import ElmoForBiLM
from .character_rows import EOS_TOKEN
from .tokenization_elmo import ElmoTokenizer
from .word_vocabulary import BOS_WORD_INDEX


def _batches(files, tokenizer, window, split, batch_size):
    sentences, located = itertools.tee(iter_sentences(files, split, tokenizer, locations=True))
    windows = pack_sentences((words for _, words in sentences), window, (where for where, _ in located))
    collate = DataCollatorForBiLM()
    while True:
        chunk = [w for _, w in zip(range(batch_size), windows)]
        if not chunk:
            return
        encoded = encode_windows(chunk, tokenizer)
        yield collate([{"input_ids": i, "labels": l} for i, l in zip(encoded["input_ids"], encoded["labels"])])


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
    if tokenizer.word_vocabulary is None:
        raise ValueError("The tokenizer has no word vocabulary: perplexity needs the one the model was trained with.")
    if len(tokenizer.word_vocabulary) != model.config.vocab_size:
        raise ValueError(
            f"The tokenizer's vocabulary has {len(tokenizer.word_vocabulary)} words but the model's softmax "
            f"{model.config.vocab_size}."
        )
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
    forward, backward = torch.exp(sums / counts).tolist()
    return {
        "forward": forward,
        "backward": backward,
        "geometric_mean": math.sqrt(forward * backward),
        "targets": int(counts[0]),
    }


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


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--model", required=True, help="folder written by hf-elmo train")
    parser.add_argument("files", nargs="+", help="text files, one sentence per line")
    parser.add_argument("--window", type=int, default=20, help="positions per window, as in training")
    parser.add_argument("--split", choices=SPLITS, default="whitespace", help=f"as in training; {SPLIT_HELP}")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")


def run(args: argparse.Namespace) -> int:
    model, tokenizer = load_bilm(args.model, args.device)
    result = compute_perplexity(model, tokenizer, args.files, args.window, args.split, args.batch_size)
    print(f"targets per direction  {result['targets']:,}")
    print(f"forward perplexity     {result['forward']:.2f}")
    print(f"backward perplexity    {result['backward']:.2f}")
    print(f"geometric mean         {result['geometric_mean']:.2f}")
    return 0


__all__ = ["compute_perplexity", "load_bilm", "unigram_perplexity"]
