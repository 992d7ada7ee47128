"""The building blocks of the task heads that are not ELMo's own: the task encoder of the paper's task models (its
ScalarMixes, an optional BiLSTM, user-supplied word vectors), ESIM's pair comparison, BiDAF's attention flow, the
sequence head's loss, and the heads' shared plumbing from inputs to word features (`ElmoTaskFeaturesMixin`).

Each module keeps the attribute names of the heads' saved weights (`task_encoder.*`, `pair_comparison.*`).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .batch_encoding_elmo import PAIR_PREFIX
from .character_rows import word_keys, words_to_char_ids
from .compute_paths import exporting
from .configuration_elmo import ElmoConfig
from .input_checks import check_cached_layers, check_pair_given, check_pair_rows, check_pair_side, check_sequence_labels
from .scalar_mix import ScalarMix


class ElmoWordVectors(nn.Module):
    """User-supplied context-independent word vectors (e.g. GloVe), looked up from the character ids.

    Words are found through 64-bit keys of their character rows (`character_rows.word_keys`), so no word-id input and no
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
        keys = word_keys(torch.from_numpy(words_to_char_ids(words, self.width)), self.lowercase)
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
        keys = word_keys(char_ids, self.lowercase)
        index = torch.searchsorted(self.sorted_keys, keys).clamp(max=len(self.sorted_keys) - 1)
        found = self.sorted_keys[index] == keys
        return F.embedding(torch.where(found, self.rows[index], 0), self.weight)


@torch.no_grad()
def init_task_layer(module: nn.Module) -> bool:
    """Initialises a ScalarMix, word vectors or an LSTM of the task heads for training; False for other modules."""
    if isinstance(module, ScalarMix):
        init.copy_(module.scalar_parameters, torch.tensor(module.initial_weights))
        init.constant_(module.gamma, module.initial_gamma)
    elif isinstance(module, ElmoWordVectors):
        init.zeros_(module.weight)
        init.constant_(module.sorted_keys, -1)  # a word of this key finds row 0, the zero vector, as unknown words do
        init.zeros_(module.rows)
    elif isinstance(module, nn.LSTM):
        bound = 1.0 / math.sqrt(module.hidden_size)  # PyTorch's own LSTM initialisation
        for param in module.parameters():
            init.uniform_(param, -bound, bound)
    else:
        return False
    return True


def word_mask(mask: torch.Tensor) -> torch.Tensor:
    """The `(B, T)` mask of real positions (`<S>`/`</S>` included, right padding) -> the `(B, T)` mask of the word
    features of `ElmoTaskEncoder`, True at index `j` for word `j` (position `j + 1`); the last two always False."""
    words = mask.sum(dim=1) - 2
    return torch.arange(mask.shape[1], device=mask.device) < words[:, None]


def run_lstm(lstm: nn.LSTM, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A batch-first `lstm` over `(B, W, F)` `inputs`, each row to its length in the `(B, W)` `mask`; 0 past it (a row
    without words runs one zero step)."""
    if exporting():  # packing reads the lengths' values, and `nn.LSTM` makes the length a constant
        return _scanned_lstm(lstm, inputs, mask) * mask[..., None]
    lengths = mask.sum(dim=1).clamp(min=1).cpu()
    packed = nn.utils.rnn.pack_padded_sequence(inputs, lengths, batch_first=True, enforce_sorted=False)
    output = nn.utils.rnn.pad_packed_sequence(lstm(packed)[0], batch_first=True, total_length=inputs.shape[1])[0]
    return output * mask[..., None]


def _scanned_lstm(lstm: nn.LSTM, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`run_lstm`'s computation with one `scan` per layer and direction, whose shapes depend on the input's shapes
    only: every row steps through every position, its state changing at its words only (as in `ElmoLstmLayer`)."""
    from torch._higher_order_ops.scan import scan  # PyTorch's, not public yet

    # Copies, not views: PyTorch's guards on the base of a scanned view fail with an AttributeError instead of naming
    # a dimension specialized by the example.
    words = mask.t()[..., None].clone(memory_format=torch.contiguous_format)  # (W, B, 1)
    for layer in range(lstm.num_layers):
        directions = []
        for suffix, reverse in (("", False), ("_reverse", True)):
            input_weight, input_bias, state_weight, state_bias = (
                getattr(lstm, f"{name}_l{layer}{suffix}") for name in ("weight_ih", "bias_ih", "weight_hh", "bias_hh")
            )
            gate_inputs = F.linear(inputs, input_weight, input_bias).transpose(0, 1)
            gate_inputs = gate_inputs.clone(memory_format=torch.contiguous_format)  # contiguous() keeps one row a view
            # Two tensors: an exported scan given one tensor as both carries computes wrong values.
            start = tuple(inputs.new_zeros(inputs.shape[0], lstm.hidden_size) for _ in range(2))
            outputs = scan(_lstm_step(state_weight, state_bias), start, (gate_inputs, words), reverse=reverse)[1]
            directions.append(outputs.transpose(0, 1))
        inputs = torch.cat(directions, dim=-1)
    return inputs


def _lstm_step(state_weight: torch.Tensor, state_bias: torch.Tensor):
    """One step of `nn.LSTM` (gates `[input, forget, cell, output]`) for `scan`: rows at a real position change."""

    def step(state, position):
        (hidden, memory), (gate_input, real) = state, position
        gates = gate_input + F.linear(hidden, state_weight, state_bias)
        input_gate, forget_gate, cell_input, output_gate = gates.chunk(4, dim=-1)
        new_memory = torch.sigmoid(forget_gate) * memory + torch.sigmoid(input_gate) * torch.tanh(cell_input)
        new_hidden = torch.sigmoid(output_gate) * torch.tanh(new_memory)
        return (torch.where(real, new_hidden, hidden), torch.where(real, new_memory, memory)), new_hidden

    return step


class ElmoTaskEncoder(nn.Module):
    """biLM layers -> word features for a classifier, as in the paper's task models.

    ELMo (a ScalarMix of the biLM layers, then dropout) enters at the input of an optional BiLSTM, next to optional
    word vectors, and/or at its output; each place has its own ScalarMix. Sentence boundaries are dropped after
    mixing (the mix's layer-norm statistics include them, as in AllenNLP): the features keep the `T` positions of the
    input, shifted by one, rather than the `T - 2` words: `torch.export` cannot keep a size that may be 0 or 1
    dynamic, and an exported graph would refuse batches whose longest sentence has fewer than two words.
    """

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.mixed_layers = list(config.scalar_mix_layers or range(config.num_layers + 1))
        self.placement = list(config.elmo_placement)
        mix_options = dict(
            initial_weights=config.scalar_mix_weights,
            initial_gamma=config.scalar_mix_gamma,
            trainable=config.scalar_mix_trainable,
            do_layer_norm=config.scalar_mix_layer_norm,
        )
        self.scalar_mixes = nn.ModuleDict(
            {place: ScalarMix(len(self.mixed_layers), **mix_options) for place in self.placement}
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
        return self.dropout(mixed.roll(-1, dims=1))

    def forward(self, input_ids: torch.LongTensor, layers: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """`(B, T, 50)` character ids with the boundary rows (for the word vectors), `(B, T, num_layers + 1, 2P)`
        biLM layers and the `(B, T)` mask of real positions (`<S>`/`</S>` included) -> `(B, T, output_size)`:
        features of word `j` (position `j + 1`) at index `j`, 0 where `word_mask(mask)` is False."""
        words = word_mask(mask)
        inputs = []
        if "input" in self.placement:
            inputs.append(self._elmo("input", layers, mask))
        if self.word_vectors is not None:
            inputs.append(self.word_vectors(input_ids.roll(-1, dims=1)))
        features = torch.cat(inputs, dim=-1) * words[..., None]
        if self.lstm is not None:
            features = run_lstm(self.lstm, features, words)
            if "output" in self.placement:
                features = torch.cat([features, self._elmo("output", layers, mask)], dim=-1) * words[..., None]
        return features

    def l2_penalty(self) -> torch.Tensor:
        """Sum of the squared ScalarMix weights of every place."""
        return sum(mix.l2_penalty() for mix in self.scalar_mixes.values())


def pool_words(features: torch.Tensor, word_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """`(B, W, F)` features, `(B, W)` mask -> `(B, F)` (`"mean"`, `"max"`) or `(B, 2F)` (`"mean_max"`); sentences
    without words pool to 0."""
    weights = word_mask[..., None].to(features.dtype)
    pooled = []
    if pooling in ("mean", "mean_max"):
        pooled.append((features * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1))
    if pooling in ("max", "mean_max"):
        maximum = features.masked_fill(~word_mask[..., None], float("-inf")).amax(dim=1)
        pooled.append(torch.where(word_mask.any(dim=1, keepdim=True), maximum, 0.0))
    return torch.cat(pooled, dim=-1)


def sequence_classification_loss(config: ElmoConfig, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`(B, num_labels)` logits and their labels -> the loss of `config.problem_type`, inferred as transformers does
    when unset (and then stored in the config)."""
    if config.problem_type is None:
        if logits.shape[1] == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    check_sequence_labels(labels, config.problem_type, *logits.shape)
    if config.problem_type == "regression":
        return F.mse_loss(logits.squeeze(-1) if labels.dim() == 1 else logits, labels.to(logits.dtype))
    if config.problem_type == "single_label_classification":
        return F.cross_entropy(logits, labels)
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
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
        aligned_a = masked_softmax(similarity, b_mask[:, None, :], dim=2) @ b
        aligned_b = masked_softmax(similarity.transpose(1, 2), a_mask[:, None, :], dim=2) @ a
        pooled = []
        for words, aligned, mask in ((a, aligned_a, a_mask), (b, aligned_b, b_mask)):
            enhanced = torch.cat([words, aligned, words - aligned, words * aligned], dim=-1)
            projected = F.relu(self.projection(self.dropout(enhanced)))
            weights = mask[..., None].to(projected.dtype)
            pooled.append((projected * weights).sum(dim=1) / weights.sum(dim=1))
            pooled.append(projected.masked_fill(~mask[..., None], float("-inf")).amax(dim=1))
        return self.dropout(torch.cat(pooled, dim=-1))


def attention_flow(similarity: nn.Linear, context, context_mask, question, question_mask) -> torch.Tensor:
    """BiDAF's attention flow (Seo et al. 2017), context-to-question and question-to-context, with the similarity
    `w^T [h; u; h * u] + b` of the `nn.Linear(3F, 1)` `similarity`: `(B, Wc, F)`, `(B, Wq, F)` -> `G` `(B, Wc, 4F)`."""
    weight = similarity.weight[0]
    size = context.shape[-1]
    w_context, w_question, w_product = weight[:size], weight[size : 2 * size], weight[2 * size :]
    scores = (
        (context @ w_context)[:, :, None]
        + (question @ w_question)[:, None, :]
        + (context * w_product) @ question.transpose(1, 2)
        + similarity.bias
    )
    attended_question = masked_softmax(scores, question_mask[:, None, :], dim=2) @ question
    best = scores.masked_fill(~question_mask[:, None, :], torch.finfo(scores.dtype).min).amax(dim=2)
    attended_context = (masked_softmax(best, context_mask, dim=1)[:, None, :] @ context).expand_as(context)
    return torch.cat([context, attended_question, context * attended_question, context * attended_context], dim=-1)


def answer_position_logits(word_logits, no_answer, context_mask, lowest: float) -> torch.Tensor:
    """`(B, Tc, 1)` logits of the context words (word `j` at index `j`, its `(B, Tc)` `word_mask` `context_mask`) and
    `(B,)` of the empty answer -> `(B, Tc)` logits over the positions of `pair_input_ids`: the empty answer at 0,
    word `j` at `j + 1`, `lowest` at padding and `</S>`."""
    at_positions = word_logits[..., 0].masked_fill(~context_mask, lowest).roll(1, dims=1)
    first = torch.arange(at_positions.shape[1], device=at_positions.device) == 0
    return torch.where(first, no_answer[:, None], at_positions)


class ElmoTaskFeaturesMixin:
    """How a task head (`elmo`, `task_encoder`, `config`) turns its inputs into word features: the biLM's layers
    (given or computed, with its input checks; frozen with `freeze_elmo`) through the task encoder, for one sentence
    or each side of a pair."""

    def _freeze_elmo(self):
        if self.config.freeze_elmo:  # a fixed feature extractor: no gradients, no dropout
            self.elmo.requires_grad_(False)
            self.elmo.eval()

    def train(self, mode: bool = True):
        super().train(mode)
        # Also here: `from_pretrained` replaces loaded parameters with new trainable ones, then calls `eval()`.
        self._freeze_elmo()
        return self

    def _init_weights(self, module: nn.Module):
        if not init_task_layer(module):
            super()._init_weights(module)

    def set_word_vectors(self, vectors: torch.Tensor, words: list[str]):
        """Loads `vectors` `(V, dim)` for the `V` `words` into a model built with `word_vectors_size=V,
        word_vectors_dim=dim`; other words get a zero vector."""
        if self.task_encoder.word_vectors is None:
            raise ValueError(
                "This model has no word vectors: build it with word_vectors_size=V and word_vectors_dim=dim, e.g. "
                "from_pretrained(folder, num_labels=..., word_vectors_size=V, word_vectors_dim=dim)."
            )
        self.task_encoder.word_vectors.set_vectors(vectors, words)

    def _task_features(self, input_ids, attention_mask, elmo_hidden_states, input_word_ids):
        """Word features `(B, T, F)` (word `j` at index `j`, see `ElmoTaskEncoder`), the `(B, T)` mask of real
        positions (boundaries included) and the biLM layers `(B, T, num_layers + 1, 2P)` they were computed from (given
        as `elmo_hidden_states`, or computed)."""
        mask = self.elmo.check_inputs(input_ids, attention_mask, input_word_ids, framed=True)
        if elmo_hidden_states is None:
            with torch.set_grad_enabled(torch.is_grad_enabled() and not self.config.freeze_elmo):
                layers = self.elmo(
                    input_ids, attention_mask=mask, input_word_ids=input_word_ids, output_hidden_states=True
                ).hidden_states
            elmo_hidden_states = torch.stack(layers, dim=2)
        else:
            check_cached_layers(self.config, elmo_hidden_states, input_ids)
        return self.task_encoder(input_ids, elmo_hidden_states, mask), mask, elmo_hidden_states

    def _pair_task_features(self, first: tuple, second: tuple) -> tuple[tuple, tuple]:
        """`_task_features` of each side of a sentence pair (`first` and `second` each its `_task_features` arguments):
        per side, the word features `(B, T, F)`, their `(B, T)` `word_mask` and its biLM layers."""
        check_pair_given(type(self).__name__, second[0], reads_pairs=True)
        sides = []
        for prefix, side in (("", first), (PAIR_PREFIX, second)):
            try:
                features, mask, layers = self._task_features(*side)
            except ValueError as error:
                if not prefix:
                    raise
                raise ValueError(f"the second sentences ({prefix}...): {error}") from None
            check_pair_side(prefix, mask)
            sides.append((features, word_mask(mask), layers))
        check_pair_rows(sides[0][0].shape[0], sides[1][0].shape[0])
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


__all__ = [
    "ElmoPairComparison",
    "ElmoTaskEncoder",
    "ElmoTaskFeaturesMixin",
    "ElmoWordVectors",
    "answer_position_logits",
    "attention_flow",
    "init_task_layer",
    "masked_softmax",
    "pool_words",
    "run_lstm",
    "sequence_classification_loss",
    "word_mask",
]
