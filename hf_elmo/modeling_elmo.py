"""PyTorch ELMo: character CNN, highway, projection and a bidirectional LSTM language model.

Numerically equivalent to AllenNLP's `_ElmoBiLm` (and bilm-tf) for converted weights; see
`conversion/convert_original_elmo.py` for the weight mapping. Unlike those implementations the model
is stateless by default: the LSTM state is passed in and returned explicitly.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput, can_return_tuple

from .configuration_elmo import ElmoConfig
from .fast_lstm import lstm_direction
from .onednn_linear import linear

ElmoState = tuple[torch.Tensor, torch.Tensor]
"""`(hidden, memory)`: `hidden` `(num_layers, B, 2P)` and `memory` `(num_layers, B, 2D)`, the forward
direction in the first half of the last axis and the backward direction in the second half."""


@dataclass
class ElmoModelOutput(ModelOutput):
    """
    Args:
        last_hidden_state (`torch.FloatTensor` of shape `(B, T, 2P)`): top LSTM layer, `[forward | backward]`,
            exactly 0 at padded positions.
        hidden_states (`tuple(torch.FloatTensor)`, *optional*): `num_layers + 1` tensors `(B, T, 2P)`, returned
            with `output_hidden_states=True`: layer 0 is the character-CNN token embedding `[x | x]`, then each
            LSTM layer. Boundary positions (`<S>`, `</S>`) are included; padded positions are exactly 0.
        state (`ElmoState`, *optional*): returned with `use_cache=True`; pass it back as `state=` to continue
            each row from where it ended (forward: after its last real position; backward: after position 0).
    """

    last_hidden_state: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    state: ElmoState | None = None


class ElmoCharacterEmbedding(nn.Module):
    """Character embedding whose id 0 (no character: a padded word) is a fixed zero vector.

    Only the `n_characters - 1` real rows are parameters, as in the original weight file.
    """

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.n_characters - 1, config.char_embedding_dim))

    def forward(self, char_ids: torch.LongTensor) -> torch.Tensor:
        """`(..., C)` ids -> `(..., C, e)` embeddings."""
        table = F.pad(self.weight, (0, 0, 1, 0))
        return F.embedding(char_ids, table)


class ElmoHighwayLayer(nn.Linear):
    """`g * x + (1 - g) * relu(A x + a)` with `g = sigmoid(G x + gamma)`.

    The weight is `[A; G]` `(2F, F)` and the bias `[a; gamma]`, AllenNLP's layout; ReLU regardless of
    the CNN activation.
    """

    def __init__(self, dim: int):
        super().__init__(dim, 2 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        transformed, gate = linear(x, self.weight, self.bias).chunk(2, dim=-1)
        transformed = F.relu(transformed)
        return torch.addcmul(transformed, torch.sigmoid(gate), x - transformed)


class ElmoCharacterEncoder(nn.Module):
    """Words as character ids `(..., C)` -> context-independent token embeddings `(..., P)`.

    Computes exactly the max over every window of every slot, but only once per distinct word of the
    input, and only over the windows that can differ between words: the slots after a word's last
    change of character (in practice its padding characters) hold one repeated character, and every
    window lying inside that run gives the same value, one constant per filter and character.
    """

    # Words are grouped by how many leading slots need real windows, rounded up to this many, so that a
    # long word does not make every short word's windows long.
    SPAN_GRANULARITY = 8

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.char_embedding = ElmoCharacterEmbedding(config)
        self.convolutions = nn.ModuleList(
            nn.Conv1d(config.char_embedding_dim, num, kernel_size=width) for width, num in config.filters
        )
        self.highways = nn.ModuleList(ElmoHighwayLayer(config.num_filters) for _ in range(config.n_highway))
        self.projection = nn.Linear(config.num_filters, config.projection_dim)
        self.activation = torch.tanh if config.activation == "tanh" else F.relu

    def forward(self, char_ids: torch.LongTensor) -> torch.Tensor:
        batch_shape, num_chars = char_ids.shape[:-1], char_ids.shape[-1]
        words, word_index = torch.unique(char_ids.reshape(-1, num_chars), dim=0, return_inverse=True)
        # Slots up to the last one that differs from the final slot; 0 when all slots hold one character.
        differs = words != words[:, -1:]
        spans = torch.where(differs, torch.arange(1, num_chars + 1, device=words.device), 0).amax(dim=1)
        spans, order = spans.sort()
        features = self._max_over_windows(words[order], spans.tolist())
        for highway in self.highways:
            features = highway(features)
        embeddings = linear(features, self.projection.weight, self.projection.bias)
        sorted_position = torch.empty_like(order)
        sorted_position[order] = torch.arange(len(order), device=order.device)
        return embeddings[sorted_position[word_index]].reshape(*batch_shape, -1)

    def _max_over_windows(self, words: torch.LongTensor, spans: list[int]) -> torch.Tensor:
        """`(U, C)` words sorted by span, with their spans -> activated CNN features `(U, F)`."""
        num_chars = words.shape[1]
        max_width = max(conv.kernel_size[0] for conv in self.convolutions)
        # A window inside the final run: the kernel summed over its width times the run's character.
        final_char = self.char_embedding(words[:, -1])  # (U, e)
        run_values = [linear(final_char, conv.weight.sum(dim=-1)) for conv in self.convolutions]  # (U, n) each
        group_features = []
        for start, end, span in _span_groups(spans, self.SPAN_GRANULARITY):
            chars = self.char_embedding(words[start:end, : min(span + max_width - 1, num_chars)])  # (u, L, e)
            per_filter = []
            for conv, run_value in zip(self.convolutions, run_values):
                width = conv.kernel_size[0]
                num_windows = min(span, num_chars - width + 1)
                value = run_value[start:end]
                if num_windows > 0:
                    windows = chars[:, : num_windows + width - 1].unfold(1, width, 1)  # (u, windows, e, width)
                    window_max = linear(windows.flatten(2), conv.weight.flatten(1)).amax(dim=1)
                    # Windows from `span` on lie inside the final run; if the word has any, their value counts.
                    value = window_max if num_windows == num_chars - width + 1 else torch.maximum(window_max, value)
                per_filter.append(value)
            group_features.append(torch.cat(per_filter, dim=-1))
        bias = torch.cat([conv.bias for conv in self.convolutions])
        # The bias and the activation commute with the max: rounding and both activations are monotonic.
        return self.activation(torch.cat(group_features) + bias)


def _span_groups(spans: list[int], granularity: int) -> list[tuple[int, int, int]]:
    """Runs of ascending `spans` that round up to the same multiple of `granularity`: `(start, end, longest)`."""
    groups, start = [], 0
    for end in range(1, len(spans) + 1):
        if end == len(spans) or (spans[end] + granularity - 1) // granularity != (spans[start] + granularity - 1) // granularity:
            groups.append((start, end, spans[end - 1]))
            start = end
    return groups


class ElmoLstmLayer(nn.Module):
    """One direction of one LSTM layer with a projected, clipped state (AllenNLP's `LstmCellWithProjection`).

    Gates in row order `[input, forget, cell, output]`, each `D` rows.
    """

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.cell_dim = config.cell_dim
        self.cell_clip = config.cell_clip
        self.proj_clip = config.proj_clip
        self.input_linearity = nn.Linear(config.projection_dim, 4 * config.cell_dim, bias=False)
        self.state_linearity = nn.Linear(config.projection_dim, 4 * config.cell_dim, bias=True)
        self.state_projection = nn.Linear(config.cell_dim, config.projection_dim, bias=False)

    def forward(
        self,
        inputs: torch.Tensor,
        hidden: torch.Tensor,
        memory: torch.Tensor,
        batch_sizes: list[int],
        reverse: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """
        Args:
            inputs: `(T, B, P)`, time-major, rows sorted by length, longest first.
            hidden: `(B, P)` and memory `(B, D)`: the state before the first step of this direction.
            batch_sizes: `T` ints, how many rows are real at each step.
            reverse: walk from the last real position down to 0.

        Returns:
            outputs `(T, B, P)` (0 at padded positions), final hidden `(B, P)`, final memory `(B, D)`.
            A row's state changes only at its real positions.
        """
        # The input-to-gate products of all steps are one matrix product; only W_h h is sequential.
        gate_inputs = linear(inputs, self.input_linearity.weight, self.state_linearity.bias)
        return lstm_direction(
            gate_inputs,
            hidden,
            memory,
            self.state_linearity.weight,
            self.state_projection.weight,
            batch_sizes,
            reverse,
            self.cell_clip,
            self.proj_clip,
        )


class ElmoBiLstm(nn.Module):
    """Two independent stacks of `ElmoLstmLayer`; the directions meet only in the outputs."""

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.use_skip_connections = config.use_skip_connections
        self.dropout = nn.Dropout(config.dropout)
        self.forward_layers = nn.ModuleList(ElmoLstmLayer(config) for _ in range(config.num_layers))
        self.backward_layers = nn.ModuleList(ElmoLstmLayer(config) for _ in range(config.num_layers))

    def forward(
        self, token_embeddings: torch.Tensor, mask: torch.BoolTensor, state: ElmoState
    ) -> tuple[list[torch.Tensor], ElmoState]:
        """`(B, T, P)` embeddings, `(B, T)` right-padded mask -> `num_layers` outputs `(B, T, 2P)` (0 at
        padding) and the final state."""
        lengths = mask.sum(dim=1)
        lengths, order = lengths.sort(descending=True, stable=True)
        steps = torch.arange(mask.shape[1], device=mask.device)
        batch_sizes = (lengths[None, :] > steps[:, None]).sum(dim=1).tolist()
        if bool((order == torch.arange(len(order), device=order.device)).all()):
            order = None  # already sorted: skip the gathers
        hidden, memory = state
        if order is not None:
            token_embeddings, hidden, memory = token_embeddings[order], hidden[:, order], memory[:, order]
        # Time-major, so that one step's rows are contiguous (and the input products fold into one matrix product).
        forward_in = backward_in = token_embeddings.transpose(0, 1).contiguous()
        layer_outputs, final_hidden, final_memory = [], [], []
        for index, (forward_layer, backward_layer) in enumerate(zip(self.forward_layers, self.backward_layers)):
            forward_hidden, backward_hidden = hidden[index].chunk(2, dim=-1)
            forward_memory, backward_memory = memory[index].chunk(2, dim=-1)
            # bilm-tf wraps every cell, residual included, in input dropout.
            forward_in, backward_in = self.dropout(forward_in), self.dropout(backward_in)
            forward_out, forward_hidden, forward_memory = forward_layer(
                forward_in, forward_hidden.contiguous(), forward_memory.contiguous(), batch_sizes, reverse=False
            )
            backward_out, backward_hidden, backward_memory = backward_layer(
                backward_in, backward_hidden.contiguous(), backward_memory.contiguous(), batch_sizes, reverse=True
            )
            if self.use_skip_connections and index > 0:
                forward_out = forward_out + forward_in
                backward_out = backward_out + backward_in
            forward_in, backward_in = forward_out, backward_out
            layer_outputs.append(torch.cat([forward_out, backward_out], dim=-1).transpose(0, 1))
            final_hidden.append(torch.cat([forward_hidden, backward_hidden], dim=-1))
            final_memory.append(torch.cat([forward_memory, backward_memory], dim=-1))
        final_state = (torch.stack(final_hidden), torch.stack(final_memory))
        if order is not None:
            restore = torch.empty_like(order)
            restore[order] = torch.arange(len(order), device=order.device)
            layer_outputs = [output[restore] for output in layer_outputs]
            final_state = (final_state[0][:, restore], final_state[1][:, restore])
        else:
            layer_outputs = [output.contiguous() for output in layer_outputs]
        return layer_outputs, final_state


class ElmoPreTrainedModel(PreTrainedModel):
    config_class = ElmoConfig
    config: ElmoConfig
    base_model_prefix = "elmo"
    main_input_name = "input_ids"
    _no_split_modules = ["ElmoBiLstm"]
    _is_stateful = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        """bilm-tf's initialisation for training from scratch (AllenNLP's for the LSTM)."""
        config = self.config
        if isinstance(module, ElmoCharacterEmbedding):
            init.uniform_(module.weight, -1.0, 1.0)
        elif isinstance(module, nn.Conv1d):
            if config.activation == "relu":
                init.uniform_(module.weight, -0.05, 0.05)
            else:
                width = module.kernel_size[0]
                init.normal_(module.weight, std=math.sqrt(1.0 / (width * config.char_embedding_dim)))
            init.zeros_(module.bias)
        elif isinstance(module, ElmoHighwayLayer):
            dim = module.in_features
            init.normal_(module.weight, std=math.sqrt(1.0 / dim))
            # A gate bias of +2 passes x through at first (bilm-tf's carry bias of -2, other sign convention).
            init.copy_(module.bias, torch.cat([module.bias.new_zeros(dim), module.bias.new_full((dim,), 2.0)]))
        elif isinstance(module, ElmoLstmLayer):
            for linear in (module.input_linearity, module.state_linearity):
                if not getattr(linear.weight, "_is_hf_initialized", False):
                    blocks = torch.empty_like(linear.weight).view(4, module.cell_dim, -1)
                    for block in blocks:
                        nn.init.orthogonal_(block)
                    init.copy_(linear.weight, blocks.view_as(linear.weight))
            bias = module.state_linearity.bias.new_zeros(4, module.cell_dim)
            bias[1] = 1.0  # forget gate (Jozefowicz et al., 2015)
            init.copy_(module.state_linearity.bias, bias.flatten())
            init.kaiming_uniform_(module.state_projection.weight, a=math.sqrt(5))
        elif isinstance(module, ElmoCharacterEncoder):
            init.normal_(module.projection.weight, std=math.sqrt(1.0 / config.num_filters))
            init.zeros_(module.projection.bias)
        elif isinstance(module, nn.Linear):
            super()._init_weights(module)


class ElmoModel(ElmoPreTrainedModel):
    """The ELMo biLM: character ids `(B, T, C)` (boundaries included by the tokenizer) -> `num_layers + 1`
    layers of `(B, T, 2P)` contextual representations."""

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        self.char_encoder = ElmoCharacterEncoder(config)
        self.encoder = ElmoBiLstm(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.char_encoder.char_embedding

    def set_input_embeddings(self, value: nn.Module):
        self.char_encoder.char_embedding = value

    def initial_state(self, batch_size: int, dtype: torch.dtype = None, device: torch.device = None) -> ElmoState:
        """All-zero state, the state a row starts from when `state` is not given."""
        config = self.config
        dtype = dtype or self.dtype
        device = device or self.device
        return (
            torch.zeros(config.num_layers, batch_size, 2 * config.projection_dim, dtype=dtype, device=device),
            torch.zeros(config.num_layers, batch_size, 2 * config.cell_dim, dtype=dtype, device=device),
        )

    def _check_inputs(self, input_ids, attention_mask, state) -> torch.BoolTensor:
        """Validates the inputs and returns the `(B, T)` boolean mask of real positions."""
        config = self.config
        if input_ids is None:
            raise ValueError("ElmoModel needs input_ids of shape (batch, words, 50): character ids from ElmoTokenizer.")
        if input_ids.dim() != 3 or input_ids.shape[-1] != config.max_characters_per_token:
            raise ValueError(
                f"input_ids must have shape (batch, words, {config.max_characters_per_token}), got "
                f"{tuple(input_ids.shape)}; a single sentence needs a batch axis (input_ids[None])."
            )
        if input_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise ValueError(f"input_ids must hold integer character ids, got dtype {input_ids.dtype}.")
        if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids is empty: shape {tuple(input_ids.shape)}.")
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= config.n_characters:
            raise ValueError(f"input_ids must be in [0, {config.n_characters - 1}], found values in [{low}, {high}].")
        if attention_mask is None:
            mask = (input_ids > 0).any(dim=-1)
        else:
            if attention_mask.shape != input_ids.shape[:2]:
                raise ValueError(
                    f"attention_mask must have shape {tuple(input_ids.shape[:2])} (batch, words), "
                    f"got {tuple(attention_mask.shape)}."
                )
            mask = attention_mask.bool()
        lengths = mask.sum(dim=1, keepdim=True)
        if not torch.equal(mask, torch.arange(mask.shape[1], device=mask.device) < lengths):
            raise ValueError("ELMo needs right-padded input: every attention_mask row must be ones then zeros.")
        if state is not None:
            expected = tuple(t.shape for t in self.initial_state(input_ids.shape[0], device="meta"))
            if not isinstance(state, (tuple, list)) or len(state) != 2 or tuple(t.shape for t in state) != expected:
                got = tuple(tuple(t.shape) for t in state) if isinstance(state, (tuple, list)) else type(state)
                raise ValueError(
                    f"state must be (hidden, memory) of shapes {tuple(map(tuple, expected))} for this model and a "
                    f"batch of {input_ids.shape[0]}, got {got}."
                )
        return mask

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor = None,
        attention_mask: torch.Tensor | None = None,
        state: ElmoState | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> ElmoModelOutput:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(B, T, 50)`): character ids from `ElmoTokenizer`, with the
                `<S>`/`</S>` rows; padded words are all-zero rows.
            attention_mask (`torch.Tensor` of shape `(B, T)`, *optional*): 1 at real positions; derived from
                `input_ids` when omitted. Padding must be on the right.
            state (`ElmoState`, *optional*): `out.state` of a previous call with the same batch size; row `k`
                continues from row `k`'s final state. Zeros when omitted: each sentence is then independent of
                everything else in the batch and of earlier calls.
            use_cache (`bool`, *optional*): return the final `state`.
            output_hidden_states (`bool`, *optional*): return all `num_layers + 1` layers.
        """
        mask = self._check_inputs(input_ids, attention_mask, state)
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        token_embeddings = self.char_encoder(input_ids.long())
        if state is None:
            state = self.initial_state(input_ids.shape[0], dtype=token_embeddings.dtype, device=input_ids.device)
        layer_outputs, final_state = self.encoder(token_embeddings, mask, state)
        hidden_states = None
        if output_hidden_states:
            layer0 = torch.cat([token_embeddings, token_embeddings], dim=-1) * mask[..., None]
            hidden_states = (layer0, *layer_outputs)
        return ElmoModelOutput(
            last_hidden_state=layer_outputs[-1],
            hidden_states=hidden_states,
            state=final_state if use_cache else None,
        )


__all__ = ["ElmoModel", "ElmoPreTrainedModel", "ElmoModelOutput", "ElmoState", "ElmoCharacterEncoder"]
