"""The paper's task models on top of the ELMo biLM: `ElmoForSequenceClassification` (single sentences, or sentence
pairs with ESIM's comparison), `ElmoForTokenClassification` and `ElmoForQuestionAnswering` (BiDAF's answer spans).

A `ScalarMix` of the biLM layers (frozen by default), dropout, an optional BiLSTM task encoder with ELMo at its
input and/or output, optional user-supplied word vectors, and a linear classifier; the options are `ElmoConfig`
fields. The heads read any ELMo folder, including models converted from ELMoForManyLangs (character vocabulary,
`input_word_ids`).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.modeling_outputs import (
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.utils import can_return_tuple

from .batch_encoding_elmo import PAIR_PREFIX
from .character_rows import byte_id, words_to_char_ids
from .configuration_elmo import PROBLEM_TYPES, ElmoConfig
from .input_checks import check_finite_labels
from .modeling_elmo import ElmoModel, ElmoPreTrainedModel
from .pipelines_elmo import ElmoQuestionAnsweringPipeline, ElmoTokenClassificationPipeline
from .scalar_mix import ScalarMix

_ASCII_UPPER = (byte_id(ord("A")), byte_id(ord("Z")))
_SIDE_INPUTS = ("input_ids", "attention_mask", "elmo_hidden_states", "input_word_ids")
_HASH_MODULI = (2_147_483_647, 2_147_483_629)  # two primes below 2**31: the key is both hashes, 62 bits


def _word_keys(char_ids: torch.Tensor, lowercase: bool) -> torch.Tensor:
    """`(..., 50)` character ids -> `(...)` int64 keys identifying the word spelled by each row.

    Two polynomial hashes modulo primes below 2**31, so every intermediate product fits in int64.
    """
    ids = char_ids.long()
    if lowercase:
        ids = torch.where((ids >= _ASCII_UPPER[0]) & (ids <= _ASCII_UPPER[1]), ids + 32, ids)
    high = low = torch.zeros(ids.shape[:-1], dtype=torch.long, device=ids.device)
    for column in ids.unbind(-1):
        high = (high * 263 + column) % _HASH_MODULI[0]
        low = (low * 269 + column) % _HASH_MODULI[1]
    return high * 2**31 + low


class ElmoWordVectors(nn.Module):
    """User-supplied context-independent word vectors (e.g. GloVe), looked up from the character ids.

    Words are found through 62-bit keys of their character rows (see `_word_keys`), so no word-id input and no
    tokenizer change are needed. Row 0 of `weight` is the zero vector of unknown words.
    """

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.lowercase = config.word_vectors_lowercase
        self.trainable = config.word_vectors_trainable
        self.width = config.max_characters_per_token
        self.weight = nn.Parameter(
            torch.zeros(config.word_vectors_size + 1, config.word_vectors_dim), requires_grad=self.trainable
        )
        # Sorted keys of the vocabulary and the row of `weight` holding each one's vector.
        self.register_buffer("sorted_keys", torch.full((config.word_vectors_size,), -1, dtype=torch.long))
        self.register_buffer("rows", torch.zeros(config.word_vectors_size, dtype=torch.long))

    def train(self, mode: bool = True):
        self.weight.requires_grad_(self.trainable)  # see ScalarMix.train
        return super().train(mode)

    @torch.no_grad()
    def set_vectors(self, vectors: torch.Tensor, words: list[str]):
        """Fill the table: `vectors` `(V, dim)`, `words` the `V` words they belong to, in order."""
        size, dim = self.weight.shape[0] - 1, self.weight.shape[1]
        if tuple(vectors.shape) != (size, dim) or len(words) != size:
            raise ValueError(
                f"This model holds {size} word vectors of size {dim} (config.word_vectors_size / word_vectors_dim); "
                f"got vectors of shape {tuple(vectors.shape)} and {len(words)} words."
            )
        keys = _word_keys(torch.from_numpy(words_to_char_ids(words, self.width)), self.lowercase)
        sorted_keys, order = keys.sort()
        clash = (sorted_keys[1:] == sorted_keys[:-1]).nonzero()
        if len(clash):
            first, second = order[clash[0, 0]], order[clash[0, 0] + 1]
            raise ValueError(
                f"Words {words[first]!r} (index {int(first)}) and {words[second]!r} (index {int(second)}) map to the "
                f"same entry{' once lowercased' if self.lowercase else ''}: the word list must not repeat words."
            )
        self.weight[0] = 0.0
        self.weight[1:] = vectors.to(self.weight.dtype)
        self.sorted_keys.copy_(sorted_keys)
        self.rows.copy_(order + 1)

    def forward(self, char_ids: torch.LongTensor) -> torch.Tensor:
        """`(B, T, 50)` ids -> `(B, T, dim)` vectors (0 for words not in the table)."""
        keys = _word_keys(char_ids, self.lowercase)
        index = torch.searchsorted(self.sorted_keys, keys).clamp(max=len(self.sorted_keys) - 1)
        found = self.sorted_keys[index] == keys
        return F.embedding(torch.where(found, self.rows[index], 0), self.weight)


class ElmoTaskEncoder(nn.Module):
    """biLM layers -> word features for a classifier, as in the paper's task models.

    ELMo (a ScalarMix of the biLM layers, then dropout) enters at the input of an optional BiLSTM, next to optional
    word vectors, and/or at its output; each place has its own ScalarMix. Sentence boundaries are dropped after
    mixing (the mix's layer-norm statistics include them, as in AllenNLP).
    """

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.mixed_layers = list(config.scalar_mix_layers or range(config.num_layers + 1))
        self.placement = list(config.elmo_placement)
        self.scalar_mixes = nn.ModuleDict(
            {
                place: ScalarMix(
                    len(self.mixed_layers),
                    initial_weights=config.scalar_mix_weights,
                    initial_gamma=config.scalar_mix_gamma,
                    trainable=config.scalar_mix_trainable,
                    do_layer_norm=config.scalar_mix_layer_norm,
                )
                for place in self.placement
            }
        )
        self.dropout = nn.Dropout(config.elmo_dropout)
        self.word_vectors = ElmoWordVectors(config) if config.word_vectors_size else None
        elmo_size = config.hidden_size
        input_size = (elmo_size if "input" in self.placement else 0) + config.word_vectors_dim
        self.lstm = None
        self.output_size = input_size
        if config.task_encoder_hidden_size:
            self.lstm = nn.LSTM(
                input_size,
                config.task_encoder_hidden_size,
                num_layers=config.task_encoder_num_layers,
                batch_first=True,
                bidirectional=True,
            )
            self.output_size = 2 * config.task_encoder_hidden_size + (elmo_size if "output" in self.placement else 0)

    def _elmo(self, place: str, layers: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        mixed = self.scalar_mixes[place]([layers[:, :, k] for k in self.mixed_layers], mask)
        return self.dropout(mixed[:, 1:-1])

    def forward(self, input_ids: torch.LongTensor, layers: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """
        Args:
            input_ids: `(B, T, 50)` character ids with the boundary rows (used for the word vectors).
            layers: `(B, T, num_layers + 1, 2P)` biLM layers.
            mask: `(B, T)` boolean, real positions including `<S>`/`</S>`.

        Returns:
            `(B, T - 2, output_size)`: features of word `j` (position `j + 1`) at index `j`, 0 past each
            sentence's words.
        """
        word_mask = mask[:, 2:]  # word j is real iff position j + 2 (at most </S>) is
        inputs = []
        if "input" in self.placement:
            inputs.append(self._elmo("input", layers, mask))
        if self.word_vectors is not None:
            inputs.append(self.word_vectors(input_ids[:, 1:-1]))
        features = torch.cat(inputs, dim=-1) * word_mask[..., None]
        if self.lstm is not None and features.shape[1] > 0:
            lengths = word_mask.sum(dim=1).clamp(min=1).cpu()  # a sentence without words: one zero step
            packed = nn.utils.rnn.pack_padded_sequence(features, lengths, batch_first=True, enforce_sorted=False)
            features = nn.utils.rnn.pad_packed_sequence(
                self.lstm(packed)[0], batch_first=True, total_length=features.shape[1]
            )[0]
            if "output" in self.placement:
                features = torch.cat([features, self._elmo("output", layers, mask)], dim=-1)
            features = features * word_mask[..., None]
        elif self.lstm is not None:
            features = features.new_zeros(*features.shape[:2], self.output_size)
        return features

    def l2_penalty(self) -> torch.Tensor:
        """Sum of the squared ScalarMix weights of every place."""
        return sum(mix.l2_penalty() for mix in self.scalar_mixes.values())


def _masked_softmax(scores: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax of `scores` along `dim` over the entries where `mask` (broadcast to `scores`) is True."""
    return scores.masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(dim=dim)


class ElmoPairComparison(nn.Module):
    """ESIM's local inference (Chen et al. 2017) between two sentences' word features, pooled for a classifier.

    Each word is softly aligned with the words of the other sentence (dot-product attention), enhanced as
    `[a; a~; a - a~; a * a~]`, projected (ReLU), and each sentence's projections are mean- and max-pooled over its
    words: `[mean_a; max_a; mean_b; max_b]`, `4 * feature_size` features.
    """

    def __init__(self, config: ElmoConfig, feature_size: int):
        super().__init__()
        self.projection = nn.Linear(4 * feature_size, feature_size)
        self.dropout = nn.Dropout(config.elmo_dropout)
        self.output_size = 4 * feature_size

    def forward(self, a: torch.Tensor, a_mask: torch.Tensor, b: torch.Tensor, b_mask: torch.Tensor) -> torch.Tensor:
        """`a` `(B, Wa, F)`, `b` `(B, Wb, F)` with their word masks -> `(B, 4F)`."""
        similarity = a @ b.transpose(1, 2)
        aligned_a = _masked_softmax(similarity, b_mask[:, None, :], dim=2) @ b
        aligned_b = _masked_softmax(similarity.transpose(1, 2), a_mask[:, None, :], dim=2) @ a
        pooled = []
        for words, aligned, mask in ((a, aligned_a, a_mask), (b, aligned_b, b_mask)):
            enhanced = torch.cat([words, aligned, words - aligned, words * aligned], dim=-1)
            projected = F.relu(self.projection(self.dropout(enhanced)))
            weights = mask[..., None].to(projected.dtype)
            pooled.append((projected * weights).sum(dim=1) / weights.sum(dim=1))
            pooled.append(projected.masked_fill(~mask[..., None], float("-inf")).amax(dim=1))
        return self.dropout(torch.cat(pooled, dim=-1))


class ElmoTaskPreTrainedModel(ElmoPreTrainedModel):
    """Shared machinery of the task heads: the biLM (frozen by default), the task encoder, initialisation."""

    has_classifier = True

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        # Head options may have been set after the config was built (from_pretrained(..., option=value)).
        config.validate_task_heads()
        self.elmo = ElmoModel(config)
        self.task_encoder = ElmoTaskEncoder(config)
        self._freeze_elmo()

    def _freeze_elmo(self):
        if self.config.freeze_elmo:
            # A frozen biLM is a fixed feature extractor: no gradients, no dropout.
            self.elmo.requires_grad_(False)
            self.elmo.eval()

    def train(self, mode: bool = True):
        super().train(mode)
        # Also here: `from_pretrained` replaces loaded parameters with new trainable ones, then calls `eval()`.
        self._freeze_elmo()
        return self

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        if isinstance(module, ScalarMix):
            init.copy_(module.scalar_parameters, torch.tensor(module.initial_weights))
            init.constant_(module.gamma, module.initial_gamma)
        elif isinstance(module, ElmoWordVectors):
            init.zeros_(module.weight)
            init.constant_(module.sorted_keys, -1)  # matches no word: every key is >= 0
            init.zeros_(module.rows)
        elif isinstance(module, nn.LSTM):
            bound = 1.0 / math.sqrt(module.hidden_size)  # PyTorch's own LSTM initialisation
            for param in module.parameters():
                init.uniform_(param, -bound, bound)
        else:
            super()._init_weights(module)

    def set_word_vectors(self, vectors: torch.Tensor, words: list[str]):
        """Load context-independent word vectors: `vectors` `(V, dim)` for the `V` `words`.

        The model must have been built with `word_vectors_size=V, word_vectors_dim=dim`; words not in the list get
        a zero vector.
        """
        if self.task_encoder.word_vectors is None:
            raise ValueError(
                "This model has no word vectors: build it with word_vectors_size=V and word_vectors_dim=dim, e.g. "
                "from_pretrained(folder, num_labels=..., word_vectors_size=V, word_vectors_dim=dim)."
            )
        self.task_encoder.word_vectors.set_vectors(vectors, words)

    def _task_features(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None,
        elmo_hidden_states: torch.Tensor | None,
        input_word_ids: torch.LongTensor | None,
    ) -> tuple[torch.Tensor, torch.BoolTensor, torch.Tensor]:
        """Word features `(B, T - 2, F)`, the `(B, T)` mask of real positions (boundaries included) and the biLM
        layers `(B, T, num_layers + 1, 2P)` they were computed from."""
        mask = self.elmo.check_inputs(input_ids, attention_mask, input_word_ids, framed=True)
        if elmo_hidden_states is None:
            with torch.set_grad_enabled(torch.is_grad_enabled() and not self.config.freeze_elmo):
                layers = self.elmo(
                    input_ids, attention_mask=mask, input_word_ids=input_word_ids, output_hidden_states=True
                ).hidden_states
            elmo_hidden_states = torch.stack(layers, dim=2)
        else:
            if not self.config.freeze_elmo:
                raise ValueError(
                    "elmo_hidden_states (cached biLM layers) cannot be used with freeze_elmo=False: the biLM being "
                    "fine-tuned must run on every step."
                )
            expected = (*input_ids.shape[:2], self.config.num_layers + 1, self.config.hidden_size)
            if tuple(elmo_hidden_states.shape) != expected:
                raise ValueError(
                    f"elmo_hidden_states must have shape {expected} (batch, positions, num_layers + 1, 2P) to match "
                    f"input_ids, got {tuple(elmo_hidden_states.shape)}."
                )
        return self.task_encoder(input_ids, elmo_hidden_states, mask), mask, elmo_hidden_states

    def _pair_task_features(self, first: dict, second: dict) -> tuple[tuple, tuple]:
        """`_task_features` of each side of a sentence pair: `first` and `second` hold each side's `input_ids`,
        `attention_mask`, `elmo_hidden_states` and `input_word_ids` (the second side's are the `pair_...` inputs).
        Returns, per side, the word features `(B, W, F)`, the `(B, W)` mask of its words and its biLM layers."""
        if second["input_ids"] is None:
            raise ValueError(
                f"{type(self).__name__} reads sentence pairs: pass pair_input_ids (and pair_attention_mask) for the "
                "second sentences, as tokenizer(text, text_pair) returns them"
            )
        sides = []
        for prefix, side in (("", first), (PAIR_PREFIX, second)):
            try:
                features, mask, layers = self._task_features(*(side[key] for key in _SIDE_INPUTS))
            except ValueError as error:
                if not prefix:
                    raise
                raise ValueError(f"the second sentences ({prefix}...): {error}") from None
            word_mask = mask[:, 2:]
            empty = (~word_mask.any(dim=1)).nonzero()
            if len(empty):
                raise ValueError(
                    f"{prefix}input_ids row {int(empty[0])} has no words: each side of a sentence pair needs at least "
                    "one word"
                )
            sides.append((features, word_mask, layers))
        (first_features, _, _), (second_features, _, _) = sides
        if first_features.shape[0] != second_features.shape[0]:
            raise ValueError(
                f"input_ids has {first_features.shape[0]} rows but pair_input_ids has {second_features.shape[0]}: "
                "each sentence needs its pair"
            )
        return tuple(sides)

    def _hidden_states(self, layers: torch.Tensor, output_hidden_states: bool | None) -> tuple[torch.Tensor, ...]:
        """The biLM layers as `ElmoModel` returns them, when asked for by the argument or else by the config."""
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        return layers.unbind(dim=2) if output_hidden_states else None

    def _add_l2_penalty(self, loss: torch.Tensor) -> torch.Tensor:
        if self.config.scalar_mix_l2:
            loss = loss + self.config.scalar_mix_l2 * self.task_encoder.l2_penalty()
        return loss


class ElmoForSequenceClassification(ElmoTaskPreTrainedModel):
    """ELMo sentence classifier / regressor: task features pooled over the words (boundaries excluded), then a
    linear layer. The loss follows `config.problem_type` as in transformers.

    With `config.sentence_pairs`, it classifies sentence pairs (SNLI): each sentence through the biLM and the task
    encoder on its own, then ESIM's comparison (`ElmoPairComparison`); pass `model(**tokenizer(a, b, ...))`.
    """

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        pooled_size = self.task_encoder.output_size * (2 if config.classifier_pooling == "mean_max" else 1)
        self.pair_comparison = None
        if config.sentence_pairs:
            self.pair_comparison = ElmoPairComparison(config, self.task_encoder.output_size)
            pooled_size = self.pair_comparison.output_size
        self.classifier = nn.Linear(pooled_size, config.num_labels)
        self.post_init()

    def _pool(self, features: torch.Tensor, word_mask: torch.Tensor) -> torch.Tensor:
        """`(B, W, F)` features, `(B, W)` mask -> `(B, F)` or `(B, 2F)`; sentences without words pool to 0."""
        pooling = self.config.classifier_pooling
        weights = word_mask[..., None].to(features.dtype)
        pooled = []
        if pooling in ("mean", "mean_max"):
            pooled.append((features * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1))
        if pooling in ("max", "mean_max"):
            maximum = features.masked_fill(~word_mask[..., None], float("-inf")).amax(dim=1)
            pooled.append(torch.where(word_mask.any(dim=1, keepdim=True), maximum, 0.0))
        return torch.cat(pooled, dim=-1)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        config = self.config
        batch_size, num_labels = logits.shape
        if config.problem_type is None:
            if num_labels == 1:
                config.problem_type = "regression"
            elif labels.dtype in (torch.long, torch.int):
                config.problem_type = "single_label_classification"
            else:
                config.problem_type = "multi_label_classification"
        if config.problem_type == "regression":
            if labels.shape not in ((batch_size,), (batch_size, num_labels)) or not labels.is_floating_point():
                raise ValueError(
                    f"Regression labels must be floats of shape ({batch_size},) or ({batch_size}, {num_labels}), got "
                    f"{labels.dtype} {tuple(labels.shape)}."
                )
            check_finite_labels(labels, config.problem_type)
            return F.mse_loss(logits.squeeze(-1) if labels.dim() == 1 else logits, labels.to(logits.dtype))
        if config.problem_type == "single_label_classification":
            if labels.shape != (batch_size,) or labels.is_floating_point():
                raise ValueError(
                    f"Single-label classification needs integer labels of shape ({batch_size},), got {labels.dtype} "
                    f"{tuple(labels.shape)}."
                )
            if labels.min() < 0 or labels.max() >= num_labels:
                raise ValueError(
                    f"Labels must be in [0, {num_labels - 1}] (num_labels={num_labels}), got {labels.tolist()}."
                )
            return F.cross_entropy(logits, labels)
        if config.problem_type == "multi_label_classification":
            if labels.shape != (batch_size, num_labels):
                raise ValueError(
                    f"Multi-label classification needs labels of shape ({batch_size}, {num_labels}) (one 0/1 column "
                    f"per label), got {tuple(labels.shape)}."
                )
            check_finite_labels(labels, config.problem_type)
            return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
        raise ValueError(f"Unknown problem_type {config.problem_type!r}; expected one of {PROBLEM_TYPES} or None.")

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        elmo_hidden_states: torch.Tensor | None = None,
        return_dict: bool | None = None,
        input_word_ids: torch.LongTensor | None = None,
        output_hidden_states: bool | None = None,
        pair_input_ids: torch.LongTensor | None = None,
        pair_attention_mask: torch.Tensor | None = None,
        pair_elmo_hidden_states: torch.Tensor | None = None,
        pair_input_word_ids: torch.LongTensor | None = None,
    ) -> SequenceClassifierOutput:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(B, T, 50)`): character ids from `ElmoTokenizer`, with `<S>`/`</S>`.
            attention_mask (`torch.Tensor` of shape `(B, T)`, *optional*): 1 at real positions (right padding).
            labels (*optional*): `(B,)` class ids (single-label), `(B, num_labels)` 0/1 (multi-label) or `(B,)` /
                `(B, num_labels)` floats (regression).
            elmo_hidden_states (`torch.Tensor` of shape `(B, T, num_layers + 1, 2P)`, *optional*): precomputed biLM
                layers (see `hf_elmo.data_elmo.ElmoLayerCache`); the biLM is not run when given.
            input_word_ids (`torch.LongTensor` of shape `(B, T)`, *optional*): word ids from the tokenizer, for models
                with word embeddings (converted from ELMoForManyLangs).
            output_hidden_states (`bool`, *optional*): also return the biLM's `num_layers + 1` layers `(B, T, 2P)` as
                `hidden_states` (as `ElmoModel` does; default: `config.output_hidden_states`); for pairs, those of
                the first sentences.
            pair_input_ids, pair_attention_mask, pair_elmo_hidden_states, pair_input_word_ids (*optional*): the
                second sentences of sentence pairs, as `tokenizer(text, text_pair)` returns them; needed by (and only
                by) a pair classifier (`config.sentence_pairs`).

        Returns:
            `SequenceClassifierOutput` with `logits` `(B, num_labels)` and, with labels, the loss (plus the ScalarMix L2
            penalty when `config.scalar_mix_l2 > 0`).
        """
        first = dict(zip(_SIDE_INPUTS, (input_ids, attention_mask, elmo_hidden_states, input_word_ids)))
        if self.pair_comparison is not None:
            pair = (pair_input_ids, pair_attention_mask, pair_elmo_hidden_states, pair_input_word_ids)
            second = dict(zip(_SIDE_INPUTS, pair))
            (a, a_mask, layers), (b, b_mask, _) = self._pair_task_features(first, second)
            logits = self.classifier(self.pair_comparison(a, a_mask, b, b_mask))
        else:
            if pair_input_ids is not None:
                raise ValueError(
                    "pair_input_ids given to a single-sentence classifier: build a pair classifier with "
                    "sentence_pairs=True, e.g. from_pretrained(folder, num_labels=..., sentence_pairs=True)"
                )
            features, mask, layers = self._task_features(*first.values())
            logits = self.classifier(self._pool(features, mask[:, 2:]))
        loss = None if labels is None else self._add_l2_penalty(self._loss(logits, labels))
        hidden_states = self._hidden_states(layers, output_hidden_states)
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=hidden_states)


class ElmoForTokenClassification(ElmoTaskPreTrainedModel):
    """ELMo tagger: one prediction per word, at the word's input position.

    `logits` are `(B, T, num_labels)` over the input positions like every transformers token classifier; positions of
    `<S>`, `</S>` and padding get 0 and must be labelled -100.
    """

    # `pipeline("token-classification", model=<saved folder or repo>, trust_remote_code=True)` uses this pipeline,
    # which reads 3-D character ids, instead of the built-in one (see `model_io.name_pipeline`).
    pipeline_task, pipeline_class = "token-classification", ElmoTokenClassificationPipeline

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        self.classifier = nn.Linear(self.task_encoder.output_size, config.num_labels)
        self.post_init()

    def _check_labels(self, labels: torch.Tensor, mask: torch.Tensor):
        num_labels = self.config.num_labels
        if labels.shape != mask.shape:
            raise ValueError(
                f"labels must have one entry per input position, shape {tuple(mask.shape)} like attention_mask "
                f"(-100 at <S>, </S> and padding), got {tuple(labels.shape)}; "
                "hf_elmo.data_elmo.tokenize_and_align_labels builds them from per-word labels."
            )
        if labels.is_floating_point():
            raise ValueError(f"Token classification labels must be integer class ids, got {labels.dtype}.")
        is_word = F.pad(mask[:, 2:], (1, 1), value=False)
        labelled = labels != -100
        if (labelled & ~is_word).any():
            row, position = (labelled & ~is_word).nonzero()[0].tolist()
            kind = "<S>" if position == 0 else "</S>" if mask[row, position] else "padding"
            raise ValueError(
                f"labels[{row}, {position}] = {int(labels[row, position])} labels a {kind} position: only words carry "
                "labels; use -100 there (labels do not match the words)."
            )
        if labelled.any() and (labels[labelled].min() < 0 or labels[labelled].max() >= num_labels):
            raise ValueError(
                f"Labels must be -100 or in [0, {num_labels - 1}] (num_labels={num_labels}), got values "
                f"{sorted(set(labels[labelled].tolist()))}."
            )

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        elmo_hidden_states: torch.Tensor | None = None,
        return_dict: bool | None = None,
        input_word_ids: torch.LongTensor | None = None,
        output_hidden_states: bool | None = None,
    ) -> TokenClassifierOutput:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(B, T, 50)`): character ids from `ElmoTokenizer`, with `<S>`/`</S>`.
            attention_mask (`torch.Tensor` of shape `(B, T)`, *optional*): 1 at real positions (right padding).
            labels (`torch.LongTensor` of shape `(B, T)`, *optional*): class id of the word at each position, -100 at
                `<S>`, `</S>`, padding (and words to ignore).
            elmo_hidden_states (`torch.Tensor` of shape `(B, T, num_layers + 1, 2P)`, *optional*): precomputed biLM
                layers (see `hf_elmo.data_elmo.ElmoLayerCache`); the biLM is not run when given.
            input_word_ids (`torch.LongTensor` of shape `(B, T)`, *optional*): word ids from the tokenizer, for models
                with word embeddings (converted from ELMoForManyLangs).
            output_hidden_states (`bool`, *optional*): also return the biLM's `num_layers + 1` layers `(B, T, 2P)` as
                `hidden_states` (as `ElmoModel` does; default: `config.output_hidden_states`).

        Returns:
            `TokenClassifierOutput` with `logits` `(B, T, num_labels)` and, with labels, the mean cross-entropy over
            the labelled positions (plus the ScalarMix L2 penalty when `config.scalar_mix_l2 > 0`). A batch without
            any labelled position (all -100) gives NaN, as BERT's token classifier (torch's `CrossEntropyLoss`
            averages over no terms); leave such batches out of training.
        """
        features, mask, layers = self._task_features(input_ids, attention_mask, elmo_hidden_states, input_word_ids)
        logits = F.pad(self.classifier(features) * mask[:, 2:, None], (0, 0, 1, 1))
        loss = None
        if labels is not None:
            self._check_labels(labels, mask)
            loss = self._add_l2_penalty(F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100))
        hidden_states = self._hidden_states(layers, output_hidden_states)
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=hidden_states)


class ElmoForQuestionAnswering(ElmoTaskPreTrainedModel):
    """ELMo answer-span model in the manner of BiDAF (Seo et al. 2017): the question (`input_ids`, first, as in
    transformers) and the context (`pair_input_ids`) each through the biLM and the task encoder on their own, then
    bi-directional attention (context-to-question and question-to-context), two modelling BiLSTMs, and start and end
    logits over the context positions.

    Logits are `(B, Tc)` over the positions of `pair_input_ids`: position `j + 1` is context word `j`; position 0 (the
    context's `<S>`) is the empty answer (SQuAD 2.0; as BERT's `[CLS]`); `</S>` and padding get the dtype's lowest
    value. `start_positions` / `end_positions` are positions in the same frame (0 for unanswerable questions). The
    modelling BiLSTMs have `task_encoder_hidden_size` units per direction (`projection_dim` when that is 0).
    `ElmoQuestionAnsweringPipeline` decodes the best span and handles long contexts in windows.
    """

    # As for the tagger: the built-in pipeline reads one id per token (see `model_io.name_pipeline`).
    pipeline_task, pipeline_class = "question-answering", ElmoQuestionAnsweringPipeline

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        size = self.task_encoder.output_size
        hidden = config.task_encoder_hidden_size or config.projection_dim
        self.similarity = nn.Linear(3 * size, 1)  # BiDAF's w^T [h; u; h * u]
        self.modeling = nn.LSTM(4 * size, hidden, batch_first=True, bidirectional=True)
        self.end_modeling = nn.LSTM(2 * hidden, hidden, batch_first=True, bidirectional=True)
        self.start_output = nn.Linear(4 * size + 2 * hidden, 1)
        self.end_output = nn.Linear(4 * size + 2 * hidden, 1)
        self.no_answer_output = nn.Linear(4 * size + 2 * hidden, 2)
        self.dropout = nn.Dropout(config.elmo_dropout)
        self.post_init()

    def _attention(self, context, context_mask, question, question_mask):
        """BiDAF's attention flow: `(B, Wc, F)`, `(B, Wq, F)` -> `G` `(B, Wc, 4F)`."""
        weight = self.similarity.weight[0]
        size = context.shape[-1]
        w_context, w_question, w_product = weight[:size], weight[size : 2 * size], weight[2 * size :]
        similarity = (
            (context @ w_context)[:, :, None]
            + (question @ w_question)[:, None, :]
            + (context * w_product) @ question.transpose(1, 2)
            + self.similarity.bias
        )
        attended_question = _masked_softmax(similarity, question_mask[:, None, :], dim=2) @ question
        best = similarity.masked_fill(~question_mask[:, None, :], torch.finfo(similarity.dtype).min).amax(dim=2)
        attended_context = (_masked_softmax(best, context_mask, dim=1)[:, None, :] @ context).expand_as(context)
        return torch.cat(
            [context, attended_question, context * attended_question, context * attended_context], dim=-1
        )

    def _lstm(self, lstm: nn.LSTM, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        lengths = mask.sum(dim=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(inputs, lengths, batch_first=True, enforce_sorted=False)
        output = nn.utils.rnn.pad_packed_sequence(lstm(packed)[0], batch_first=True, total_length=inputs.shape[1])[0]
        return output * mask[..., None]

    def _check_positions(self, positions: torch.Tensor, name: str, context_mask: torch.Tensor):
        words = context_mask.sum(dim=1)
        if positions.shape != words.shape or positions.is_floating_point():
            raise ValueError(
                f"{name} must be integer positions of shape {tuple(words.shape)} (one per question), got "
                f"{positions.dtype} {tuple(positions.shape)}"
            )
        outside = ((positions < 0) | (positions > words)).nonzero()
        if len(outside):
            row = int(outside[0])
            raise ValueError(
                f"{name}[{row}] = {int(positions[row])} is outside the context: its words are at positions 1 to "
                f"{int(words[row])} of pair_input_ids (0: no answer)"
            )

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor = None,
        attention_mask: torch.Tensor | None = None,
        pair_input_ids: torch.LongTensor | None = None,
        pair_attention_mask: torch.Tensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        elmo_hidden_states: torch.Tensor | None = None,
        pair_elmo_hidden_states: torch.Tensor | None = None,
        input_word_ids: torch.LongTensor | None = None,
        pair_input_word_ids: torch.LongTensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> QuestionAnsweringModelOutput:
        r"""
        Args:
            input_ids, attention_mask, elmo_hidden_states, input_word_ids: the questions, as for the other heads.
            pair_input_ids, pair_attention_mask, pair_elmo_hidden_states, pair_input_word_ids: the contexts
                (`tokenizer(questions, contexts)` gives both).
            start_positions, end_positions (`torch.LongTensor` of shape `(B,)`, *optional*): the answer's first and
                last word as positions of `pair_input_ids` (word `j` at `j + 1`), 0 for no answer.
            output_hidden_states (`bool`, *optional*): also return the questions' biLM layers as `hidden_states`.

        Returns:
            `QuestionAnsweringModelOutput` with `start_logits` and `end_logits` `(B, Tc)` and, with the positions,
            the mean of the start and end cross-entropies (plus the ScalarMix L2 penalty when `scalar_mix_l2 > 0`).
        """
        first = dict(zip(_SIDE_INPUTS, (input_ids, attention_mask, elmo_hidden_states, input_word_ids)))
        pair = (pair_input_ids, pair_attention_mask, pair_elmo_hidden_states, pair_input_word_ids)
        second = dict(zip(_SIDE_INPUTS, pair))
        (question, question_mask, layers), (context, context_mask, _) = self._pair_task_features(first, second)
        flow = self._attention(context, context_mask, question, question_mask)
        modeled = self._lstm(self.modeling, self.dropout(flow), context_mask)
        end_modeled = self._lstm(self.end_modeling, self.dropout(modeled), context_mask)
        start_features = self.dropout(torch.cat([flow, modeled], dim=-1))
        end_features = self.dropout(torch.cat([flow, end_modeled], dim=-1))
        lowest = torch.finfo(flow.dtype).min
        pooled = start_features.masked_fill(~context_mask[..., None], lowest).amax(dim=1)
        no_answer = self.no_answer_output(pooled)
        logits = []
        outputs = ((self.start_output, start_features), (self.end_output, end_features))
        for index, (output, features) in enumerate(outputs):
            word_logits = output(features)[..., 0].masked_fill(~context_mask, lowest)
            end_boundary = word_logits.new_full((word_logits.shape[0], 1), lowest)
            logits.append(torch.cat([no_answer[:, index : index + 1], word_logits, end_boundary], dim=1))
        start_logits, end_logits = logits
        loss = None
        if start_positions is not None or end_positions is not None:
            if start_positions is None or end_positions is None:
                raise ValueError("start_positions and end_positions go together: pass both or neither")
            self._check_positions(start_positions, "start_positions", context_mask)
            self._check_positions(end_positions, "end_positions", context_mask)
            reversed_rows = (start_positions > end_positions).nonzero()
            if len(reversed_rows):
                row = int(reversed_rows[0])
                raise ValueError(
                    f"start_positions[{row}] = {int(start_positions[row])} comes after end_positions[{row}] = "
                    f"{int(end_positions[row])}: an answer ends at or after its start"
                )
            loss = (F.cross_entropy(start_logits, start_positions) + F.cross_entropy(end_logits, end_positions)) / 2
            loss = self._add_l2_penalty(loss)
        hidden_states = self._hidden_states(layers, output_hidden_states)
        return QuestionAnsweringModelOutput(
            loss=loss, start_logits=start_logits, end_logits=end_logits, hidden_states=hidden_states
        )


__all__ = [
    "ElmoForQuestionAnswering",
    "ElmoForSequenceClassification",
    "ElmoForTokenClassification",
    "ElmoPairComparison",
    "ElmoTaskPreTrainedModel",
]
