"""The paper's task models on top of the ELMo biLM: `ElmoForSequenceClassification` and `ElmoForTokenClassification`.

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
from transformers.modeling_outputs import SequenceClassifierOutput, TokenClassifierOutput
from transformers.utils import can_return_tuple

from .character_rows import byte_id, words_to_char_ids
from .configuration_elmo import PROBLEM_TYPES, ElmoConfig
from .input_checks import check_finite_labels
from .modeling_elmo import ElmoModel, ElmoPreTrainedModel
from .pipelines_elmo import ElmoTokenClassificationPipeline
from .scalar_mix import ScalarMix

_ASCII_UPPER = (byte_id(ord("A")), byte_id(ord("Z")))
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
    linear layer. The loss follows `config.problem_type` as in transformers."""

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        pooled_size = self.task_encoder.output_size * (2 if config.classifier_pooling == "mean_max" else 1)
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
                `hidden_states` (as `ElmoModel` does; default: `config.output_hidden_states`).

        Returns:
            `SequenceClassifierOutput` with `logits` `(B, num_labels)` and, with labels, the loss (plus the ScalarMix L2
            penalty when `config.scalar_mix_l2 > 0`).
        """
        features, mask, layers = self._task_features(input_ids, attention_mask, elmo_hidden_states, input_word_ids)
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


__all__ = ["ElmoForSequenceClassification", "ElmoForTokenClassification", "ElmoTaskPreTrainedModel"]
