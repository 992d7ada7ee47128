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
from .sampled_softmax import full_softmax_loss, sampled_softmax_loss

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
        transformed, gate = super().forward(x).chunk(2, dim=-1)
        gate = torch.sigmoid(gate)
        return gate * x + (1 - gate) * F.relu(transformed)


class ElmoCharacterEncoder(nn.Module):
    """Words as character ids `(..., C)` -> context-independent token embeddings `(..., P)`."""

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
        chars = self.char_embedding(char_ids.reshape(-1, num_chars)).transpose(1, 2)  # (N, e, C)
        # Max over positions, then the activation: equal to activation-then-max since both are monotonic.
        features = torch.cat([self.activation(conv(chars).amax(dim=-1)) for conv in self.convolutions], dim=-1)
        for highway in self.highways:
            features = highway(features)
        return self.projection(features).reshape(*batch_shape, -1)


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
        mask: torch.BoolTensor,
        hidden: torch.Tensor,
        memory: torch.Tensor,
        reverse: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """
        Args:
            inputs: `(B, T, P)`.
            mask: `(B, T)`, right-padded: `True` at real positions.
            hidden: `(B, P)` and memory `(B, D)`: the state before the first step of this direction.
            reverse: walk from the last real position down to 0.

        Returns:
            outputs `(B, T, P)` (0 at padded positions), final hidden `(B, P)`, final memory `(B, D)`.
            A row's state changes only at its real positions.
        """
        batch_size, seq_len, _ = inputs.shape
        gate_inputs = self.input_linearity(inputs)  # one product for all steps; only W_h h is sequential
        outputs = [None] * seq_len
        steps = range(seq_len - 1, -1, -1) if reverse else range(seq_len)
        for t in steps:
            gates = gate_inputs[:, t] + self.state_linearity(hidden)
            input_gate, forget_gate, cell_input, output_gate = gates.chunk(4, dim=-1)
            new_memory = torch.sigmoid(input_gate) * torch.tanh(cell_input) + torch.sigmoid(forget_gate) * memory
            if self.cell_clip is not None:
                new_memory = new_memory.clamp(-self.cell_clip, self.cell_clip)
            new_hidden = self.state_projection(torch.sigmoid(output_gate) * torch.tanh(new_memory))
            if self.proj_clip is not None:
                new_hidden = new_hidden.clamp(-self.proj_clip, self.proj_clip)
            real = mask[:, t, None]
            memory = torch.where(real, new_memory, memory)
            hidden = torch.where(real, new_hidden, hidden)
            outputs[t] = new_hidden * real
        return torch.stack(outputs, dim=1), hidden, memory


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
        """`(B, T, P)` embeddings -> `num_layers` outputs `(B, T, 2P)` and the final state."""
        hidden, memory = state
        forward_in = backward_in = token_embeddings
        layer_outputs, final_hidden, final_memory = [], [], []
        for index, (forward_layer, backward_layer) in enumerate(zip(self.forward_layers, self.backward_layers)):
            forward_hidden, backward_hidden = hidden[index].chunk(2, dim=-1)
            forward_memory, backward_memory = memory[index].chunk(2, dim=-1)
            # bilm-tf wraps every cell, residual included, in input dropout.
            forward_in, backward_in = self.dropout(forward_in), self.dropout(backward_in)
            forward_out, forward_hidden, forward_memory = forward_layer(
                forward_in, mask, forward_hidden, forward_memory, reverse=False
            )
            backward_out, backward_hidden, backward_memory = backward_layer(
                backward_in, mask, backward_hidden, backward_memory, reverse=True
            )
            if self.use_skip_connections and index > 0:
                forward_out = forward_out + forward_in
                backward_out = backward_out + backward_in
            forward_in, backward_in = forward_out, backward_out
            layer_outputs.append(torch.cat([forward_out, backward_out], dim=-1))
            final_hidden.append(torch.cat([forward_hidden, backward_hidden], dim=-1))
            final_memory.append(torch.cat([forward_memory, backward_memory], dim=-1))
        return layer_outputs, (torch.stack(final_hidden), torch.stack(final_memory))


class ElmoPreTrainedModel(PreTrainedModel):
    config_class = ElmoConfig
    config: ElmoConfig
    base_model_prefix = "elmo"
    main_input_name = "input_ids"
    _no_split_modules = ["ElmoBiLstm"]
    _is_stateful = True
    # A pre-training checkpoint (`ElmoForBiLM`) holds the word softmax, which other heads leave out on purpose.
    _keys_to_ignore_on_load_unexpected = [r"^softmax\."]

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


@dataclass
class ElmoBiLMOutput(ModelOutput):
    """
    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*): with `labels`: the mean over both directions' target
            words of their cross-entropy, i.e. `0.5 * (forward_loss + backward_loss)` when both directions have the
            same number of targets (always the case for `DataCollatorForBiLM` batches). Sampled softmax in training
            when `config.num_softmax_samples` is below the vocabulary size, full softmax otherwise.
        forward_loss (`torch.FloatTensor` of shape `()`, *optional*): mean cross-entropy of the forward LM.
        backward_loss (`torch.FloatTensor` of shape `()`, *optional*): mean cross-entropy of the backward LM.
        forward_logits (`torch.FloatTensor` of shape `(B, T, V)`, *optional*): with `return_logits=True`: full
            softmax scores of the word following each position.
        backward_logits (`torch.FloatTensor` of shape `(B, T, V)`, *optional*): same for the preceding word.
        hidden_states (`tuple(torch.FloatTensor)`, *optional*): as `ElmoModelOutput.hidden_states`.
    """

    loss: torch.FloatTensor | None = None
    forward_loss: torch.FloatTensor | None = None
    backward_loss: torch.FloatTensor | None = None
    forward_logits: torch.FloatTensor | None = None
    backward_logits: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None


class ElmoWordSoftmax(nn.Linear):
    """The word softmax `(P) -> (V)` shared by the forward and the backward LM (bilm-tf's `softmax/W`, `softmax/b`)."""

    def __init__(self, config: ElmoConfig):
        super().__init__(config.projection_dim, config.vocab_size)


class ElmoForBiLM(ElmoPreTrainedModel):
    """The ELMo bidirectional language model with its word softmax, for pre-training and domain adaptation.

    The forward LM predicts the word after each position from the forward half of the top layer, the backward
    LM the word before it from the backward half; both use one softmax. `labels` `(B, T, 2)` hold, per position,
    the id of the word to predict in each direction (`-100`: nothing to predict); `DataCollatorForBiLM` builds
    them. `ElmoModel.from_pretrained` of a saved `ElmoForBiLM` loads the biLM without the softmax.
    """

    # The loss is normalised by Trainer's `num_items_in_batch` (target words over the accumulated batch on all
    # processes), which makes gradient accumulation and multi-process training exact token-weighted means.
    accepts_loss_kwargs = True

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        if config.vocab_size < 1:
            raise ValueError(
                "ElmoForBiLM needs config.vocab_size >= 1 (the words of its softmax), got "
                f"{config.vocab_size}; set it to the size of the word vocabulary."
            )
        self.elmo = ElmoModel(config)
        self.dropout = nn.Dropout(config.dropout)
        self.softmax = ElmoWordSoftmax(config)
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        if isinstance(module, ElmoWordSoftmax):
            # bilm-tf: normal with std 1/sqrt(fan in), zero bias.
            init.normal_(module.weight, std=1.0 / math.sqrt(module.in_features))
            init.zeros_(module.bias)
        else:
            super()._init_weights(module)

    def get_input_embeddings(self) -> nn.Module:
        return self.elmo.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module):
        self.elmo.set_input_embeddings(value)

    def uses_sampled_softmax(self) -> bool:
        """Whether a training-mode forward uses the sampled softmax (else the full one)."""
        return 0 < self.config.num_softmax_samples < self.config.vocab_size

    def _check_labels(self, labels: torch.Tensor, positions: torch.Size):
        expected = (*positions, 2)
        if labels.shape != expected:
            raise ValueError(
                f"labels must have shape {expected} (batch, positions, [forward target, backward target]), "
                f"got {tuple(labels.shape)}."
            )
        if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
            raise ValueError(f"labels must hold integer word ids, got dtype {labels.dtype}.")
        bad = (labels != -100) & ((labels < 0) | (labels >= self.config.vocab_size))
        if bad.any():
            raise ValueError(
                f"labels must be word ids in [0, {self.config.vocab_size - 1}] or -100 (no target), found "
                f"{labels[bad][0].item()}; was the vocabulary used for the data the one of this model?"
            )

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        return_logits: bool = False,
        output_hidden_states: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        return_dict: bool | None = None,
    ) -> ElmoBiLMOutput:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(B, T, 50)`): character ids with the `<S>`/`</S>` rows, as
                for `ElmoModel`.
            attention_mask (`torch.Tensor` of shape `(B, T)`, *optional*): 1 at real positions.
            labels (`torch.LongTensor` of shape `(B, T, 2)`, *optional*): `labels[b, t, 0]` the id of the word
                after position `t` (forward LM target), `labels[b, t, 1]` the id of the word before it (backward
                LM target); -100 where there is none.
            return_logits (`bool`, defaults to `False`): also return the full-softmax logits `(B, T, V)` of
                both directions.
            num_items_in_batch (`int` or `torch.Tensor`, *optional*): divide the summed cross-entropy by this many
                targets (both directions counted) instead of this batch's count; passed by `Trainer`.
        """
        outputs = self.elmo(input_ids, attention_mask=attention_mask, output_hidden_states=output_hidden_states)
        top = self.dropout(outputs.last_hidden_state)
        forward_hidden, backward_hidden = top.chunk(2, dim=-1)

        loss = forward_loss = backward_loss = None
        if labels is not None:
            self._check_labels(labels, top.shape[:2])
            forward_targets, backward_targets = labels[..., 0], labels[..., 1]
            forward_real, backward_real = forward_targets != -100, backward_targets != -100
            hidden = torch.cat([forward_hidden[forward_real], backward_hidden[backward_real]])
            targets = torch.cat([forward_targets[forward_real], backward_targets[backward_real]]).long()
            if self.training and self.uses_sampled_softmax():
                losses = sampled_softmax_loss(
                    hidden, targets, self.softmax.weight, self.softmax.bias, self.config.num_softmax_samples
                )
            else:
                losses = full_softmax_loss(hidden, targets, self.softmax.weight, self.softmax.bias)
            num_forward = int(forward_real.sum())
            forward_sum, backward_sum = losses[:num_forward].sum(), losses[num_forward:].sum()
            forward_loss = forward_sum / max(num_forward, 1)
            backward_loss = backward_sum / max(len(losses) - num_forward, 1)
            if num_items_in_batch is None:
                num_items_in_batch = max(len(losses), 1)
            loss = (forward_sum + backward_sum) / num_items_in_batch

        forward_logits = backward_logits = None
        if return_logits:
            forward_logits, backward_logits = self.softmax(forward_hidden), self.softmax(backward_hidden)
        return ElmoBiLMOutput(
            loss=loss,
            forward_loss=forward_loss,
            backward_loss=backward_loss,
            forward_logits=forward_logits,
            backward_logits=backward_logits,
            hidden_states=outputs.hidden_states,
        )


__all__ = [
    "ElmoModel",
    "ElmoPreTrainedModel",
    "ElmoModelOutput",
    "ElmoState",
    "ElmoCharacterEncoder",
    "ElmoForBiLM",
    "ElmoBiLMOutput",
]
