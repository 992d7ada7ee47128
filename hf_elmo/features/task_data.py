"""Data helpers for training the ELMo heads: word-label alignment, a collator, and the frozen-biLM layer cache."""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..batch_encoding_elmo import PAIR_PREFIX
from ..character_rows import pad_rows
from ..modeling_elmo import ElmoModel


def tokenize_and_align_labels(
    tokenizer,
    words: Sequence[Sequence[str]],
    word_labels: Sequence[Sequence[int | str]],
    label2id: Mapping[str, int] | None = None,
    **tokenizer_kwargs,
):
    """Encode pre-split sentences and give each input position the label of its word.

    Args:
        tokenizer: an `ElmoTokenizer`.
        words: `B` sentences, each a list of words.
        word_labels: `B` lists with one label per word (ints, or strings mapped through `label2id`).
        tokenizer_kwargs: e.g. `truncation=True, max_length=...`; labels of words cut off are dropped with them.

    Returns:
        The tokenizer's encoding plus `labels`: per sentence, one entry per input position, -100 at `<S>`, `</S>`
        (and at padding when padding was requested).
    """
    if len(words) != len(word_labels):
        raise ValueError(f"Got {len(words)} sentences but {len(word_labels)} label lists.")
    for index, (sentence, labels) in enumerate(zip(words, word_labels)):
        if len(sentence) != len(labels):
            raise ValueError(
                f"Sentence {index} has {len(sentence)} words but {len(labels)} labels: labels must match the words "
                f"one to one (words {list(sentence)[:8]}...)."
            )
    encoding = tokenizer(list(map(list, words)), is_split_into_words=True, **tokenizer_kwargs)
    aligned = []
    for index, labels in enumerate(word_labels):
        if label2id is not None:
            unknown = sorted({label for label in labels if label not in label2id})
            if unknown:
                raise ValueError(f"Sentence {index} has labels missing from label2id: {unknown}.")
            labels = [label2id[label] for label in labels]
        aligned.append([-100 if word is None else int(labels[word]) for word in encoding.word_ids(index)])
    if tokenizer_kwargs.get("return_tensors") is not None:
        aligned = torch.tensor(aligned)
    encoding["labels"] = aligned
    return encoding


def _as_tensor(value: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(dtype)
    return torch.tensor(np.asarray(value), dtype=dtype)  # a copy: arrays read from datasets are read-only


class DataCollatorForElmo:
    """Batches examples for the ELMo heads: pads `input_ids`/`attention_mask` with the tokenizer, per-position
    `labels` with -100, and cached `elmo_hidden_states` `(T_i, num_layers + 1, 2P)` with zeros; for sentence pairs,
    the `pair_...` features and `pair_elmo_hidden_states` of the second sentences likewise.

    Per-example labels that are scalars or fixed-size vectors (sequence classification) are stacked as they are.
    Labels under `label` or `label_ids` (a `datasets` column's usual names) come out as `labels`, as
    `DataCollatorWithPadding` gives them.
    """

    def __init__(self, tokenizer, label_pad_token_id: int = -100):
        self.tokenizer = tokenizer
        self.label_pad_token_id = label_pad_token_id

    def __call__(self, features: list[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        label_key = next((key for key in ("labels", "label", "label_ids") if key in features[0]), None)
        labels = [feature[label_key] for feature in features] if label_key is not None else None
        cached = [key for key in ("elmo_hidden_states", PAIR_PREFIX + "elmo_hidden_states") if key in features[0]]
        rest = [{k: v for k, v in f.items() if k != label_key and k not in cached} for f in features]
        batch = dict(self.tokenizer.pad(rest, padding=True, return_tensors="pt"))
        positions = batch["input_ids"].shape[1]
        for key in cached:  # the layers of each side, padded as its input_ids
            layers = [_as_tensor(feature[key], torch.float32) for feature in features]
            side_positions = batch[key.replace("elmo_hidden_states", "input_ids")].shape[1]
            batch[key] = torch.from_numpy(pad_rows(layers, side_positions, dtype=np.float32))
        if labels is not None:
            lengths = [len(f["input_ids"]) for f in features]
            labels = [_as_tensor(label) for label in labels]
            if all(label.dim() == 1 and len(label) == n for label, n in zip(labels, lengths)) and labels[0].dtype in (
                torch.int64,
                torch.int32,
            ):
                batch["labels"] = torch.from_numpy(pad_rows(labels, positions, fill=self.label_pad_token_id))
            else:
                batch["labels"] = torch.stack(labels)
        return batch


class ElmoLayerCache:
    """A `datasets.map(..., batched=True)` function storing the frozen biLM's layers with each example, so that
    training epochs (and several heads trained on the same data) do not run the biLM again.

        dataset = dataset.map(ElmoLayerCache(model), batched=True, batch_size=64)
        # each example gains "elmo_hidden_states" (T_i, num_layers + 1, 2P); DataCollatorForElmo pads it and the
        # heads use it instead of running the biLM. Pairs also gain "pair_elmo_hidden_states", their second sentences'.

    The layers are computed in evaluation mode, exactly as a frozen biLM computes them inside the heads. A sentence's
    layers do not depend on the rest of its batch (the model is stateless) up to float rounding of different batch
    shapes (about 1e-6 in float32); cached in the training batches themselves (same sentences together, e.g.
    `train_sampling_strategy="sequential"` and this `batch_size`), training is bit-identical to running the biLM.

    Args:
        model: an `ElmoModel` or a head holding one (`model.elmo`); its biLM must be frozen.
        batch_size: sentences per biLM call within each `map` batch.
    """

    def __init__(self, model, batch_size: int = 32):
        if not isinstance(model, ElmoModel):
            if not getattr(model.config, "freeze_elmo", True):
                raise ValueError("ElmoLayerCache needs a frozen biLM; this model fine-tunes it (freeze_elmo=False).")
            model = model.elmo
        self.model = model
        self.batch_size = batch_size

    @torch.no_grad()
    def __call__(self, examples: Mapping[str, Sequence[Any]]) -> dict[str, list[np.ndarray]]:
        was_training = self.model.training
        self.model.eval()
        cached = {"elmo_hidden_states": self._layers(examples["input_ids"], examples.get("input_word_ids"))}
        if PAIR_PREFIX + "input_ids" in examples:  # sentence pairs: each side is a sentence of its own
            rows, word_ids = examples[PAIR_PREFIX + "input_ids"], examples.get(PAIR_PREFIX + "input_word_ids")
            cached[PAIR_PREFIX + "elmo_hidden_states"] = self._layers(rows, word_ids)
        self.model.train(was_training)
        return cached

    def _layers(self, rows: Sequence[Any], word_ids: Sequence[Any] | None) -> list[np.ndarray]:
        device = self.model.device
        cached = []
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start : start + self.batch_size]
            lengths = [len(r) for r in chunk]
            inputs = {"input_ids": torch.from_numpy(pad_rows(chunk)).to(device)}
            if word_ids is not None:  # models converted from ELMoForManyLangs; padded positions are not read
                inputs["input_word_ids"] = torch.from_numpy(pad_rows(word_ids[start : start + self.batch_size]))
                inputs["input_word_ids"] = inputs["input_word_ids"].to(device)
            # No attention_mask: the model reads real positions off the ids, also for examples stored padded.
            layers = self.model(**inputs, output_hidden_states=True)
            stacked = torch.stack(layers.hidden_states, dim=2).float().cpu().numpy()
            cached.extend(stacked[i, :n] for i, n in enumerate(lengths))
        return cached


__all__ = ["DataCollatorForElmo", "ElmoLayerCache", "tokenize_and_align_labels"]
