"""PyTorch ELMo: character CNN, highway, projection and a bidirectional LSTM language model.

Numerically equivalent to AllenNLP's `_ElmoBiLm` (and bilm-tf) for converted weights; see
`conversion/convert_original_elmo.py` for the weight mapping. Unlike those implementations the model
is stateless by default: the LSTM state is passed in and returned explicitly.
"""

import glob
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput, can_return_tuple

from .configuration_elmo import ElmoConfig

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
    """Words as character ids `(..., C)` -> context-independent token embeddings `(..., P)`.

    With `config.input_word_dim > 0` (ELMoForManyLangs models) each word's embedding is looked up from its
    word id too and concatenated before the CNN features, `[word | characters]`, ahead of the projection.
    """

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.char_embedding = ElmoCharacterEmbedding(config)
        self.convolutions = nn.ModuleList(
            nn.Conv1d(config.char_embedding_dim, num, kernel_size=width) for width, num in config.filters
        )
        self.highways = nn.ModuleList(ElmoHighwayLayer(config.num_filters) for _ in range(config.n_highway))
        self.word_embedding = (
            nn.Embedding(config.input_word_vocab_size, config.input_word_dim) if config.input_word_dim else None
        )
        self.projection = nn.Linear(config.input_word_dim + config.num_filters, config.projection_dim)
        self.activation = torch.tanh if config.activation == "tanh" else F.relu

    def forward(self, char_ids: torch.LongTensor, word_ids: torch.LongTensor | None = None) -> torch.Tensor:
        """`(..., C)` character ids (and `(...)` word ids with word embeddings) -> `(..., P)`."""
        batch_shape, num_chars = char_ids.shape[:-1], char_ids.shape[-1]
        chars = self.char_embedding(char_ids.reshape(-1, num_chars)).transpose(1, 2)  # (N, e, C)
        # Max over positions, then the activation: equal to activation-then-max since both are monotonic.
        features = torch.cat([self.activation(conv(chars).amax(dim=-1)) for conv in self.convolutions], dim=-1)
        for highway in self.highways:
            features = highway(features)
        if self.word_embedding is not None:
            features = torch.cat([self.word_embedding(word_ids.reshape(-1)), features], dim=-1)
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
        self.forget_bias = config.forget_bias
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
        if self.forget_bias:
            gate_inputs[..., self.cell_dim : 2 * self.cell_dim] += self.forget_bias
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


_PICKLE_REFUSED = (
    "ELMo loads weights only from safetensors by default, because a pickle checkpoint (pytorch_model.bin) can run "
    "code hidden in it while loading. If you trust its origin, pass use_safetensors=False explicitly."
)


class ElmoPreTrainedModel(PreTrainedModel):
    config_class = ElmoConfig
    config: ElmoConfig
    base_model_prefix = "elmo"
    main_input_name = "input_ids"
    _no_split_modules = ["ElmoBiLstm"]
    _is_stateful = True

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, use_safetensors: bool | None = None, **kwargs):
        """`PreTrainedModel.from_pretrained` that reads weights only from safetensors unless `use_safetensors=False`.

        A pickle checkpoint (`pytorch_model.bin`) is a program that runs while it is read; transformers restricts
        it with `weights_only`, but that unpickler has had escapes. Loading one therefore needs the explicit
        `use_safetensors=False` (and is best followed by `save_pretrained`, which writes safetensors).
        """
        if use_safetensors is not None:
            return super().from_pretrained(
                pretrained_model_name_or_path, *model_args, use_safetensors=use_safetensors, **kwargs
            )
        path = str(pretrained_model_name_or_path)
        folder = os.path.join(path, kwargs.get("subfolder", ""))
        only_pickles = os.path.isdir(folder) and not glob.glob(os.path.join(folder, "*.safetensors*"))
        if (os.path.isfile(path) and not path.endswith(".safetensors")) or (
            only_pickles and glob.glob(os.path.join(folder, "*.bin"))
        ):
            raise OSError(f"{path}: {_PICKLE_REFUSED}")
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *model_args, use_safetensors=True, **kwargs)
        except OSError as error:
            if "use_safetensors" not in str(error):  # a Hub repo without safetensors: transformers' hint misleads
                raise
            raise OSError(f"{path}: {_PICKLE_REFUSED}") from None

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
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, std=1.0 / math.sqrt(module.embedding_dim))
        elif isinstance(module, ElmoCharacterEncoder):
            init.normal_(module.projection.weight, std=math.sqrt(1.0 / module.projection.in_features))
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

    def _check_inputs(self, input_ids, attention_mask, state, input_word_ids=None) -> torch.BoolTensor:
        """Validates the inputs (`ValueError` naming the problem) and returns the `(B, T)` mask of real positions.

        A `state` is checked against this model's sizes, the batch size, dtype and device; a state from another
        model with the same `num_layers`, `projection_dim` and `cell_dim` cannot be told apart and is accepted.
        """
        config = self.config
        chars = config.max_characters_per_token
        if input_ids is None:
            raise ValueError(
                f"ElmoModel needs input_ids of shape (batch, words, {chars}): character ids from ElmoTokenizer."
            )
        if not isinstance(input_ids, torch.Tensor):
            raise ValueError(
                "input_ids must be a torch.Tensor (tokenizer(..., return_tensors='pt')), got "
                f"{type(input_ids).__name__}."
            )
        if input_ids.dim() != 3 or input_ids.shape[-1] != chars:
            raise ValueError(
                f"input_ids must have shape (batch, words, {chars}), got "
                f"{tuple(input_ids.shape)}; a single sentence needs a batch axis (input_ids[None])."
            )
        if input_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise ValueError(f"input_ids must hold integer character ids, got dtype {input_ids.dtype}.")
        if input_ids.shape[0] == 0:
            raise ValueError(
                f"input_ids is an empty batch: shape {tuple(input_ids.shape)}; pass at least one sentence."
            )
        if input_ids.shape[1] == 0:
            raise ValueError(
                f"input_ids is empty: shape {tuple(input_ids.shape)} has no positions; every sentence, even an "
                "empty one, needs its <S> and </S> rows (tokenize with add_special_tokens=True)."
            )
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= config.n_characters:
            raise ValueError(
                f"input_ids must be in [0, {config.n_characters - 1}], found values in [{low}, {high}]; were they "
                "made by this model's tokenizer?"
            )
        if attention_mask is None:
            mask = (input_ids > 0).any(dim=-1)
        else:
            if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape[:2]:
                got = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask)
                raise ValueError(
                    f"attention_mask must have shape {tuple(input_ids.shape[:2])} (batch, words), got {got}."
                )
            mask = attention_mask.bool()
        lengths = mask.sum(dim=1, keepdim=True)
        if not torch.equal(mask, torch.arange(mask.shape[1], device=mask.device) < lengths):
            raise ValueError("ELMo needs right-padded input: every attention_mask row must be ones then zeros.")
        self._check_word_ids(input_word_ids, input_ids.shape[:2])
        if state is not None:
            self._check_state(state, input_ids)
        return mask

    def _check_word_ids(self, input_word_ids, shape: torch.Size):
        vocab_size = self.config.input_word_vocab_size
        if not vocab_size:
            if input_word_ids is not None:
                raise ValueError(
                    "input_word_ids given, but this model has no word embeddings (config.input_word_dim = 0); they "
                    "are read only by models converted from ELMoForManyLangs."
                )
            return
        if not isinstance(input_word_ids, torch.Tensor):
            raise ValueError(
                f"This model reads word embeddings beside the characters: pass input_word_ids {tuple(shape)} from its "
                f"tokenizer, got {type(input_word_ids).__name__}."
            )
        if input_word_ids.shape != shape or input_word_ids.is_floating_point() or input_word_ids.dtype == torch.bool:
            raise ValueError(
                f"input_word_ids must be integer ids of shape {tuple(shape)} (batch, words), got "
                f"{tuple(input_word_ids.shape)} of dtype {input_word_ids.dtype}."
            )
        low, high = int(input_word_ids.min()), int(input_word_ids.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(f"input_word_ids must be in [0, {vocab_size - 1}], found values in [{low}, {high}].")

    def _check_state(self, state, input_ids: torch.Tensor):
        batch_size = input_ids.shape[0]
        expected = tuple(tuple(t.shape) for t in self.initial_state(batch_size, device="meta"))
        is_pair = isinstance(state, (tuple, list)) and len(state) == 2
        is_pair = is_pair and all(isinstance(t, torch.Tensor) for t in state)
        got = tuple(tuple(t.shape) for t in state) if is_pair else type(state).__name__
        if not is_pair or got != expected:
            raise ValueError(
                f"state must be (hidden, memory) of shapes {expected} (num_layers, batch, 2 * projection_dim / "
                f"2 * cell_dim) for this model and a batch of {batch_size}, got {got}."
            )
        dtypes, devices = {t.dtype for t in state}, {t.device for t in state}
        if dtypes != {self.dtype} or devices != {input_ids.device}:
            raise ValueError(
                f"state must be {self.dtype} on {input_ids.device} like the model and input_ids, got "
                f"{sorted(map(str, dtypes))} on {sorted(map(str, devices))}."
            )

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor = None,
        attention_mask: torch.Tensor | None = None,
        state: ElmoState | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        input_word_ids: torch.LongTensor | None = None,
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
            input_word_ids (`torch.LongTensor` of shape `(B, T)`, *optional*): word ids from the tokenizer, needed
                by (and only by) models with word embeddings (`config.input_word_dim > 0`, ELMoForManyLangs).
        """
        mask = self._check_inputs(input_ids, attention_mask, state, input_word_ids)
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        word_ids = input_word_ids.long() if input_word_ids is not None else None
        token_embeddings = self.char_encoder(input_ids.long(), word_ids)
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
