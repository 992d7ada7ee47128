"""PyTorch ELMo: character CNN, highway, projection and a bidirectional LSTM language model, then the task heads.

Equivalent to AllenNLP's `_ElmoBiLm` (and bilm-tf) for converted weights (`original_format.weight_links`), but
stateless: the LSTM state is passed in and out explicitly, else every row starts from zeros or the warm start state.
Each `forward` shows the plain math; the fast paths live in their own modules, chosen by `config.paths`
(`compute_paths.py`).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import QuestionAnsweringModelOutput, SequenceClassifierOutput, TokenClassifierOutput
from transformers.utils import ModelOutput, can_return_tuple

from .char_cnn_fast import char_cnn_forward
from .compute_paths import ElmoPaths, exporting
from .configuration_elmo import ElmoConfig
from .cpu_kernels import dropout_forward as compiled_dropout_forward
from .cuda_graphs import CaptureCache, replay_training_step
from .input_checks import (
    check_answer_positions,
    check_bilm_batch,
    check_inputs,
    check_labels,
    check_pair_given,
    check_softmax_vocabulary,
    check_token_labels,
    check_warm_state,
    direction_rows,
)
from .lstm_sorted import sorted_forward
from .lstm_static import CapturedLayers, static_forward
from .paths_resolution import paths_in_effect
from .pipelines_elmo import ElmoQuestionAnsweringPipeline, ElmoTokenClassificationPipeline
from .pretrained_elmo import ElmoPreTrainedMixin
from .sampled_softmax import bilm_loss_sums
from .task_layers import (
    ElmoPairComparison,
    ElmoTaskEncoder,
    ElmoTaskFeaturesMixin,
    answer_position_logits,
    attention_flow,
    pool_words,
    run_lstm,
    sequence_classification_loss,
    word_mask,
)
from .tokenization_elmo import ElmoTokenizer

ElmoState = tuple[torch.Tensor, torch.Tensor]
"""`(hidden (num_layers, B, 2P), memory (num_layers, B, 2D))`, each `[forward | backward]` on its last axis."""


@dataclass
class ElmoModelOutput(ModelOutput):
    """
    Args:
        last_hidden_state (`(B, T, 2P)`): top LSTM layer `[forward | backward]`, exactly 0 at padding.
        hidden_states (*optional*, `output_hidden_states=True`): `num_layers + 1` tensors `(B, T, 2P)`: the token
            embedding `[x | x]`, then each LSTM layer; boundaries included, exactly 0 at padding.
        state (`ElmoState`, *optional*, `use_cache=True`): each row's final state, to continue from as `state=`.
    """

    last_hidden_state: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    state: ElmoState | None = None


class ElmoDropout(nn.Dropout):
    """`nn.Dropout` whose training masks on float32 CPU tensors may come from the compiled loops (`paths.dropout`)."""

    def __init__(self, config: ElmoConfig):
        super().__init__(config.dropout)
        self.config = config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and paths_in_effect(self.config, x.device, x.dtype, True).dropout == "compiled":
            return compiled_dropout_forward(self, x)
        return super().forward(x)


class ElmoCharacterEmbedding(nn.Embedding):
    """Character embedding whose id 0 (a padded word) is a fixed zero vector: `weight` holds only the
    `n_characters - 1` real rows, as the original weight file; id `k > 0` reads row `k - 1`."""

    def __init__(self, config: ElmoConfig):
        rows, dim = config.n_characters - 1, config.char_embedding_dim
        # Uninitialised, as the other layers leave it to `_init_weights`: `nn.Embedding`'s own initialisation would
        # draw from the random generator and shift every draw after it.
        super().__init__(rows, dim, _weight=torch.empty(rows, dim))

    def forward(self, char_ids: torch.LongTensor) -> torch.Tensor:
        """`(..., C)` ids -> `(..., C, e)` embeddings."""
        table = F.pad(self.weight, (0, 0, 1, 0))
        return F.embedding(char_ids, table)


class ElmoHighwayLayer(nn.Linear):
    """`(..., F)` -> `(..., F)`: `g * x + (1 - g) * relu(A x + a)` with `g = sigmoid(G x + gamma)`; weight `[A; G]`
    `(2F, F)`, bias `[a; gamma]` (AllenNLP's layout); ReLU whatever the CNN's activation."""

    def __init__(self, dim: int):
        super().__init__(dim, 2 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        transformed, gate = F.linear(x, self.weight, self.bias).chunk(2, dim=-1)
        gate = torch.sigmoid(gate)
        return gate * x + (1 - gate) * F.relu(transformed)


class ElmoCharacterEncoder(GradientCheckpointingLayer):
    """Character ids `(..., C)` -> token embeddings `(..., P)`: convolutions, max over windows, highway, projection.
    With `config.input_word_dim > 0` (ELMoForManyLangs) a word embedding joins the features: `[word | characters]`.
    With gradient checkpointing one checkpointed segment in training (whichever path runs it)."""

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
        self.config = config  # `config.paths` is read at each call

    def forward(self, char_ids: torch.LongTensor, word_ids: torch.LongTensor | None = None) -> torch.Tensor:
        """`(..., C)` character ids (and `(...)` word ids with word embeddings) -> `(..., P)`."""
        paths = paths_in_effect(self.config, char_ids.device, self.char_embedding.weight.dtype, self.training)
        if paths.char_cnn != "reference":
            return char_cnn_forward(self, char_ids, word_ids, paths)
        batch_shape, num_chars = char_ids.shape[:-1], char_ids.shape[-1]
        chars = self.char_embedding(char_ids.reshape(-1, num_chars))  # (N, C, e)
        # Each convolution as the product of every window with the kernel (cuDNN's convolutions round float32 to TF32
        # on GPUs by default; matrix products do not).
        windows = [chars.unfold(1, conv.kernel_size[0], 1).flatten(2) for conv in self.convolutions]  # (N, C-w+1, we)
        products = [x @ conv.weight.flatten(1).t() + conv.bias for x, conv in zip(windows, self.convolutions)]
        features = torch.cat([self.activation(p.amax(1)) for p in products], dim=-1)
        for highway in self.highways:
            features = highway(features)
        if self.word_embedding is not None:  # ELMoForManyLangs: [word | characters]
            features = torch.cat([self.word_embedding(word_ids.reshape(-1)), features], dim=-1)
        return self.projection(features).reshape(*batch_shape, -1)


class ElmoLstmLayer(nn.Module):
    """One direction of one LSTM layer with a projected, clipped state (AllenNLP's `LstmCellWithProjection`); gates
    in row order `[input, forget, cell, output]`, each `D` rows."""

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
        self, inputs: torch.Tensor, mask: torch.BoolTensor, hidden: torch.Tensor, memory: torch.Tensor, reverse: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(B, T, P)` inputs, `(B, T)` mask, `(B, P)` and `(B, D)` state -> `(B, T, P)` outputs (0 at padding) and the
        final state; every row steps through every position (backwards with `reverse`), changing at real ones only."""
        gate_inputs = self.input_linearity(inputs)
        if self.forget_bias:  # TensorFlow's LSTMCell adds it at run time
            gate_inputs[..., self.cell_dim : 2 * self.cell_dim] += self.forget_bias

        def step(state, position):
            (hidden, memory), (gate_input, real) = state, position
            gates = gate_input + self.state_linearity(hidden)
            input_gate, forget_gate, cell_input, output_gate = gates.chunk(4, dim=-1)
            new_memory = torch.sigmoid(input_gate) * torch.tanh(cell_input) + torch.sigmoid(forget_gate) * memory
            if self.cell_clip is not None:
                new_memory = new_memory.clamp(-self.cell_clip, self.cell_clip)
            new_hidden = self.state_projection(torch.sigmoid(output_gate) * torch.tanh(new_memory))
            if self.proj_clip is not None:
                new_hidden = new_hidden.clamp(-self.proj_clip, self.proj_clip)
            real = real[:, None]
            return (torch.where(real, new_hidden, hidden), torch.where(real, new_memory, memory)), new_hidden * real

        # One loop in an exported graph whatever the length, which stays a dimension (Inductor, under torch.compile,
        # fails to lower it: there the steps are unrolled, one graph per length).
        if exporting():
            from torch._higher_order_ops.scan import scan  # PyTorch's, not public yet

            # The carry's layout, as the steps make it: `contiguous()` would keep the strides of a batch of one row,
            # which the steps' outputs do not have. The scanned inputs are copies too: PyTorch's guards on the base
            # of a view fail with an AttributeError instead of naming a dimension specialized by the example.
            initial = tuple(state.clone(memory_format=torch.contiguous_format) for state in (hidden, memory))
            steps = tuple(
                x.clone(memory_format=torch.contiguous_format) for x in (gate_inputs.transpose(0, 1), mask.t())
            )
            (hidden, memory), outputs = scan(step, initial, steps, reverse=reverse)
            return outputs.transpose(0, 1), hidden, memory
        outputs = [None] * inputs.shape[1]
        for t in reversed(range(inputs.shape[1])) if reverse else range(inputs.shape[1]):
            (hidden, memory), outputs[t] = step((hidden, memory), (gate_inputs[:, t], mask[:, t]))
        return torch.stack(outputs, dim=1), hidden, memory


class ElmoBiLstm(GradientCheckpointingLayer):
    """Two independent stacks of `ElmoLstmLayer`; the directions meet only in the outputs. With gradient checkpointing
    one checkpointed segment in training: the fast paths run every layer of both directions in one call."""

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.use_skip_connections = config.use_skip_connections
        self.dropout = ElmoDropout(config)
        self.forward_layers = nn.ModuleList(ElmoLstmLayer(config) for _ in range(config.num_layers))
        self.backward_layers = nn.ModuleList(ElmoLstmLayer(config) for _ in range(config.num_layers))
        self.config = config  # `config.paths` is read at each call
        self.captured = CapturedLayers()  # CUDA graphs of the static path's layers

    def _apply(self, fn, recurse=True):
        self.captured.clear()  # graphs read the parameters at the addresses they had when captured
        return super()._apply(fn, recurse)

    def forward(
        self, token_embeddings: torch.Tensor, mask: torch.BoolTensor, state: ElmoState
    ) -> tuple[list[torch.Tensor], ElmoState]:
        """`(B, T, P)` embeddings, `(B, T)` right-padded mask -> `num_layers` outputs `(B, T, 2P)` (0 at padding) and
        the final state."""
        hidden, memory = (t.chunk(2, dim=-1) for t in state)  # [forward | backward] halves
        # Both stacks read the same tensors, which the sorted path then sorts and lays out once.
        outputs, finals = self.directions_forward(
            [token_embeddings] * 2, [mask] * 2, [(hidden[0], memory[0]), (hidden[1], memory[1])]
        )
        layer_outputs = [torch.cat([forward, backward], dim=-1) for forward, backward in outputs]
        # In the state's dtype, also under autocast, so that it can be passed back.
        final_state = tuple(
            torch.cat([forward.to(start.dtype), backward.to(start.dtype)], dim=-1)
            for forward, backward, start in zip(*finals, state)
        )
        return layer_outputs, final_state

    def directions_forward(self, inputs, masks, states):
        """Per direction `k` (0 forward, 1 backward): `inputs[k]` `(B', T, P)`, `masks[k]` `(B', T)`, `states[k]`
        `((L, B', P), (L, B', D))` -> per layer both directions' outputs `(B', T, P)`, per direction its final state."""
        weight = self.forward_layers[0].state_linearity.weight
        paths = paths_in_effect(self.config, inputs[0].device, weight.dtype, self.training)
        if paths.lstm == "sorted":
            return sorted_forward(self, inputs, masks, states, paths)
        if paths.lstm == "static":
            return static_forward(self, inputs, masks, states, paths)
        layer_in, outputs, finals = list(inputs), [], [([], []), ([], [])]
        for index, layers in enumerate(zip(self.forward_layers, self.backward_layers)):
            layer_out = []
            for k, layer in enumerate(layers):
                x = self.dropout(layer_in[k])  # bilm-tf wraps every cell, residual included, in input dropout
                out, hidden, memory = layer(x, masks[k], states[k][0][index], states[k][1][index], reverse=k == 1)
                layer_out.append(out + x if self.use_skip_connections and index > 0 else out)
                finals[k][0].append(hidden)
                finals[k][1].append(memory)
            outputs.append(layer_out)
            layer_in = layer_out
        return outputs, [(torch.stack(hidden), torch.stack(memory)) for hidden, memory in finals]


class ElmoPreTrainedModel(ElmoPreTrainedMixin, PreTrainedModel):
    config_class = ElmoConfig
    config: ElmoConfig
    base_model_prefix = "elmo"
    main_input_name = "input_ids"
    _no_split_modules = ["ElmoBiLstm"]
    _is_stateful = True
    # The character encoder and the biLSTM (`GradientCheckpointingLayer`s; the split directions' biLSTM through
    # `ElmoModel.run_segment`), non-reentrant only.
    supports_gradient_checkpointing = True
    # The word softmax of a pre-training checkpoint (other heads leave it out), a warm state with `warm_state=False`.
    _keys_to_ignore_on_load_unexpected = [r"^softmax\.", r"warm_(hidden|memory)$"]
    has_classifier = False
    tokenizer_class = ElmoTokenizer  # saved with the model (`pretrained_elmo.write_tokenizer`)

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
        elif isinstance(module, ElmoModel) and module.config.warm_state:
            init.zeros_(module.warm_hidden)
            init.zeros_(module.warm_memory)
        elif isinstance(module, ElmoWordSoftmax):  # bilm-tf: normal with std 1/sqrt(fan in), zero bias
            init.normal_(module.weight, std=1.0 / math.sqrt(module.in_features))
            init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            super()._init_weights(module)


class ElmoModel(ElmoPreTrainedModel):
    """The ELMo biLM: character ids `(B, T, C)` (boundaries included) -> `num_layers + 1` layers `(B, T, 2P)`. With
    gradient checkpointing the character encoder and the biLSTM (transformers' `GradientCheckpointingLayer`s) each
    run as one checkpointed segment in training."""

    gradient_checkpointing = False  # set by `activation_checkpointing_enable()`, as on its layers

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        ElmoPaths.from_value(config.paths)  # e.g. from_pretrained(..., paths=...): a bad name fails here
        self.char_encoder = ElmoCharacterEncoder(config)
        self.encoder = ElmoBiLstm(config)
        if config.warm_state:
            self._register_warm_state(*self.initial_state(1, warm=False))
        self.post_init()

    def _register_warm_state(self, hidden: torch.Tensor, memory: torch.Tensor):
        # Buffers, so that they are saved with the weights and follow the model's dtype and device.
        self.register_buffer("warm_hidden", hidden.reshape(self.config.num_layers, -1))
        self.register_buffer("warm_memory", memory.reshape(self.config.num_layers, -1))

    @property
    def warm_state(self) -> ElmoState | None:
        """The warm start state `((num_layers, 2P), (num_layers, 2D))` rows start from, or `None` (zeros)."""
        return (self.warm_hidden, self.warm_memory) if self.config.warm_state else None

    @torch.no_grad()
    def set_warm_state(self, state: ElmoState | None):
        """Make `state`, `((num_layers, 2P), (num_layers, 2D))` or one row's `use_cache=True` state, the start of every
        row when no `state=` is passed (saved with the weights, `config.warm_state`); `None` removes it."""
        if state is None:
            if self.config.warm_state:
                del self.warm_hidden, self.warm_memory
            self.config.warm_state = False
            return
        expected = check_warm_state(self.config, state)
        hidden, memory = (t.detach().to(self.device, self.dtype).reshape(shape) for t, shape in zip(state, expected))
        if self.config.warm_state:
            self.warm_hidden.copy_(hidden)
            self.warm_memory.copy_(memory)
        else:
            self._register_warm_state(hidden.clone(), memory.clone())
        self.config.warm_state = True

    @property
    def paths(self) -> ElmoPaths:
        """The paths that run on the model's device and dtype in its current mode: `print(model.paths)`."""
        return paths_in_effect(self.config, self.device, self.dtype, self.training)

    def get_input_embeddings(self) -> ElmoCharacterEmbedding:
        return self.char_encoder.char_embedding

    def set_input_embeddings(self, value: nn.Module):
        self.char_encoder.char_embedding = value

    def initial_state(self, batch_size: int, dtype=None, device=None, warm: bool = True) -> ElmoState:
        """The state rows start from when `state` is not given: the warm start state (if any and `warm`), else zeros."""
        config, dtype, device = self.config, dtype or self.dtype, device or self.device
        if warm and config.warm_state:
            return tuple(
                t.to(device=device, dtype=dtype)[:, None].expand(-1, batch_size, -1).contiguous()
                for t in (self.warm_hidden, self.warm_memory)
            )
        return (
            torch.zeros(config.num_layers, batch_size, 2 * config.projection_dim, dtype=dtype, device=device),
            torch.zeros(config.num_layers, batch_size, 2 * config.cell_dim, dtype=dtype, device=device),
        )

    def check_inputs(
        self,
        input_ids,
        attention_mask=None,
        input_word_ids=None,
        state=None,
        framed: bool = False,
        values_checked_on_host: bool = False,
    ) -> torch.BoolTensor:
        """`input_checks.check_inputs` for this model -> the `(B, T)` mask of real positions; `framed`: also require
        the `<S>`/`</S>` rows around every sentence, as the task heads do; `values_checked_on_host`: the caller
        checked the values already, only shapes, dtypes and devices are checked."""
        return check_inputs(
            self.config, input_ids, attention_mask, input_word_ids, state, self.dtype, framed, values_checked_on_host
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
        values_checked_on_host: bool = False,
    ) -> ElmoModelOutput:
        r"""
        Args:
            input_ids (`(B, T, 50)`): character ids from `ElmoTokenizer` with the `<S>`/`</S>` rows; padded words 0.
            attention_mask (`(B, T)`, *optional*): 1 at real positions, padding on the right; derived when omitted.
            state (`ElmoState`, *optional*): `out.state` of a call on as many rows, row `k` continuing row `k`'s;
                otherwise every row starts from the warm start state, else zeros, independent of everything else.
            use_cache, output_hidden_states (*optional*): return the final `state`; all `num_layers + 1` layers.
            input_word_ids (`(B, T)`, *optional*): word ids, for (and only for) models with `input_word_dim > 0`.
            values_checked_on_host (defaults to `False`): the values of the inputs were checked already (e.g. by
                `check_inputs` on the host before they moved to a GPU, where each check of values is a wait for the
                device); shapes, dtypes and devices are checked all the same.
        """
        mask = self.check_inputs(
            input_ids, attention_mask, input_word_ids, state, values_checked_on_host=values_checked_on_host
        )
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        return self.forward_checked(
            input_ids,
            mask,
            state=state,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            input_word_ids=input_word_ids,
        )

    def forward_checked(
        self,
        input_ids: torch.LongTensor,
        mask: torch.BoolTensor,
        *,
        state: ElmoState | None = None,
        use_cache: bool | None = False,
        output_hidden_states: bool = False,
        input_word_ids: torch.LongTensor | None = None,
    ) -> ElmoModelOutput:
        """`forward` after `check_inputs` gave `mask` `(B, T)`: on a GPU no host synchronisation beyond the character
        CNN's (none in a captured graph)."""
        word_ids = input_word_ids.long() if input_word_ids is not None else None
        token_embeddings = self.char_encoder(input_ids.long(), word_ids)
        if state is None:
            # The model's dtype, not the embeddings' (bfloat16 under autocast): the state can then be passed back.
            state = self.initial_state(input_ids.shape[0], device=input_ids.device)
        layer_outputs, final_state = self.encoder(token_embeddings, mask, state)
        hidden_states = None
        if output_hidden_states:
            layer0 = torch.cat([token_embeddings, token_embeddings], dim=-1) * mask[..., None]
            hidden_states = (layer0, *layer_outputs)
        final_state = final_state if use_cache else None
        return ElmoModelOutput(last_hidden_state=layer_outputs[-1], hidden_states=hidden_states, state=final_state)

    def run_segment(self, function, *args):
        """`function(*args)`, as one checkpointed segment in training with gradient checkpointing: for a computation
        that is not a `GradientCheckpointingLayer`'s forward (the split directions' biLSTM)."""
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return self._gradient_checkpointing_func(function, *args)
        return function(*args)


@dataclass
class ElmoBiLMOutput(ModelOutput):
    """
    Args:
        loss, forward_loss, backward_loss (`()`, *optional*, with `labels`): mean cross-entropy over both directions'
            targets, and of each LM's (sampled softmax in training if `config.num_softmax_samples < vocab_size`).
        last_hidden_state (`(B, T, 2P)`, *optional*, without `labels`, which `Trainer` would gather): the top layer.
        forward_logits, backward_logits (`(B, T, V)`, *optional*, `return_logits=True`): scores of the next and of the
            previous word. hidden_states, state (*optional*): as in `ElmoModelOutput`.
    """

    loss: torch.FloatTensor | None = None
    forward_loss: torch.FloatTensor | None = None
    backward_loss: torch.FloatTensor | None = None
    last_hidden_state: torch.FloatTensor | None = None
    forward_logits: torch.FloatTensor | None = None
    backward_logits: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    state: ElmoState | None = None


class ElmoWordSoftmax(nn.Linear):
    """The word softmax `(P) -> (V)` shared by the forward and the backward LM (bilm-tf's `softmax/W`, `softmax/b`)."""

    def __init__(self, config: ElmoConfig):
        super().__init__(config.projection_dim, config.vocab_size)


class ElmoForBiLM(ElmoPreTrainedModel):
    """The ELMo biLM with its word softmax shared by both directions' LMs, for pre-training and domain adaptation.
    `ElmoModel.from_pretrained` of a saved `ElmoForBiLM` loads the biLM without the softmax."""

    # Normalised by Trainer's `num_items_in_batch`: accumulated and multi-process steps are exact per-word means.
    accepts_loss_kwargs = True

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        check_softmax_vocabulary(config)
        self.elmo = ElmoModel(config)
        self.dropout = ElmoDropout(config)
        self.softmax = ElmoWordSoftmax(config)
        self._captured_steps = CaptureCache(max_entries=2)  # training steps by shape (`cuda_graphs`)
        self.post_init()

    def _apply(self, fn, recurse=True):
        self._captured_steps.clear()  # graphs read the parameters at the addresses they had when captured
        return super()._apply(fn, recurse)

    def uses_sampled_softmax(self) -> bool:
        """Whether a training-mode forward uses the sampled softmax (else the full one)."""
        return 0 < self.config.num_softmax_samples < self.config.vocab_size

    def floating_point_ops(self, inputs: dict, split_directions: bool = False) -> int:
        """FLOPs of a training step on `inputs["input_ids"]` `(B, T, C)` for `Trainer`'s `total_flos`
        (`ElmoConfig.training_step_flops`; `Trainer`'s own estimate counts each position once per slot)."""
        if not isinstance(inputs.get("input_ids"), torch.Tensor):
            return 0  # as `Trainer` counts a batch without its main input
        softmax_words = self.config.num_softmax_samples if self.uses_sampled_softmax() else self.config.vocab_size
        return self.config.training_step_flops(*inputs["input_ids"].shape[:2], softmax_words, split_directions)

    def check_batch(self, input_ids, attention_mask=None, labels=None, **unused) -> None:
        """Checks a batch as `forward` would, e.g. on the host before it moves to a GPU, where `forward` can then skip
        the checks of values (`values_checked_on_host=True`); other entries of a batch dict are ignored."""
        check_bilm_batch(self.config, input_ids, attention_mask, labels)

    def _loss_sums(self, top: torch.Tensor, labels: torch.Tensor, split_directions: bool = False):
        """`sampled_softmax.bilm_loss_sums`: the sampled softmax in training when `uses_sampled_softmax()`."""
        num_samples = self.config.num_softmax_samples if self.training and self.uses_sampled_softmax() else None
        kernel = self.paths.sampled_softmax
        return bilm_loss_sums(top, labels, self.softmax, num_samples, split_directions, kernel)

    @property
    def paths(self) -> ElmoPaths:
        """The paths that run on the model's device and dtype in its current mode: `print(model.paths)`."""
        return self.elmo.paths

    def training_step_paths(
        self, input_ids, labels=None, state=None, use_cache=None, outputs_beyond_loss=False, split_directions=False
    ) -> ElmoPaths:
        """`paths` with `training_step` decided for a call with these arguments: "captured" where the step is replayed
        from CUDA graphs (`cuda_graphs.replay_training_step`), else "direct: " and why."""
        paths = self.paths
        if paths.training_step != "captured":
            return paths
        rows, length = input_ids.shape[:2] if isinstance(input_ids, torch.Tensor) else (0, 0)
        # Inputs of the wrong kinds fail their checks afterwards, with their one-line errors.
        takes_gradients = isinstance(state, (tuple, list)) and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in state
        )
        return paths.for_training_step(
            labels=labels is not None,
            outputs_beyond_loss=bool(outputs_beyond_loss),
            carried=bool(use_cache) == (state is not None),
            state_takes_gradients=takes_gradients,
            gradient_checkpointing=self.elmo.gradient_checkpointing,
            positions_per_direction=rows * length / (2 if split_directions else 1),
        )

    def _split_directions_layers(
        self, input_ids, mask, *, state=None, use_cache=False, output_hidden_states=False
    ) -> ElmoModelOutput:
        """`ElmoModel.forward_checked` for continuous streams (`training/streams.py`): the forward LM reads rows
        `0..B/2-1` only and the backward LM rows `B/2..B-1`; rows hold `[forward | 0]` or `[0 | backward]`, and the
        half of a row's final `state` that its direction did not run is the state it started from."""
        elmo = self.elmo
        rows = direction_rows(input_ids.shape[0], True)  # an odd batch fails before any work
        embeddings = elmo.char_encoder(input_ids.long(), None)
        if state is None:
            state = elmo.initial_state(input_ids.shape[0], device=input_ids.device)
        hidden, memory = (t.chunk(2, dim=-1) for t in state)  # [forward | backward] halves
        states = [(hidden[k][:, r], memory[k][:, r]) for k, r in enumerate(rows)]
        inputs, masks = [embeddings[r] for r in rows], [mask[r] for r in rows]
        outputs, finals = elmo.run_segment(elmo.encoder.directions_forward, inputs, masks, states)
        layers = [_rows_of_each_direction(forward, backward) for forward, backward in outputs]
        hidden_states = None
        if output_hidden_states:
            hidden_states = (_rows_of_each_direction(*inputs) * mask[..., None], *layers)
        final_state = None
        if use_cache:  # in the state's dtype, also under autocast, so that it can be passed back
            final_state = tuple(
                _states_of_each_direction(forward.to(start.dtype), backward.to(start.dtype), start)
                for forward, backward, start in zip(*finals, state)
            )
        return ElmoModelOutput(last_hidden_state=layers[-1], hidden_states=hidden_states, state=final_state)

    def _training_step_sums(self, input_ids, mask, labels, *state, split_directions=False):
        """`_loss_sums` of a training batch; given a start `state` (`hidden, memory`: continuous streams), also its
        final state, through which no gradient flows (the caller carries it to the next batch detached)."""
        start = tuple(state) or None
        layers = self._split_directions_layers if split_directions else self.elmo.forward_checked
        outputs = layers(input_ids, mask, state=start, use_cache=start is not None, output_hidden_states=False)
        sums = self._loss_sums(self.dropout(outputs.last_hidden_state), labels, split_directions)
        return sums if start is None else (*sums, *(t.detach() for t in outputs.state))

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        return_logits: bool = False,
        output_hidden_states: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        state: ElmoState | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        split_directions: bool = False,
        values_checked_on_host: bool = False,
    ) -> ElmoBiLMOutput:
        r"""
        Args:
            input_ids, attention_mask, state, use_cache, output_hidden_states: as for `ElmoModel`.
            split_directions (defaults to `False`): continuous streams (`training/streams.py`): the forward LM reads
                rows `0..B/2-1` only, the backward LM rows `B/2..B-1`, each scored on its half of the rows; rows
                hold `[forward | 0]` or `[0 | backward]`, and the half of a row's final `state` that its direction
                did not run is the state it started from.
            labels (`(B, T, 2)`, *optional*): per position the id of the next word (forward LM) and of the previous
                word (backward LM), -100 where there is none; `DataCollatorForBiLM` builds them.
            return_logits (defaults to `False`): also return both directions' full-softmax logits `(B, T, V)`.
            num_items_in_batch (*optional*): the number of targets to divide the summed loss by (from `Trainer`).
            values_checked_on_host (defaults to `False`): the batch's values were checked already (`check_batch`
                on the host, as `hf-elmo train` does): the model checks shapes, dtypes and devices only.
        """
        checked = values_checked_on_host
        if labels is not None and isinstance(input_ids, torch.Tensor):
            # On a GPU this waits for the device unless the host checked the values already.
            check_labels(self.config, labels, input_ids.shape[:2], split_directions, checked)
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        extra_outputs = return_logits or output_hidden_states
        paths = self.training_step_paths(input_ids, labels, state, use_cache, extra_outputs, split_directions)
        if paths.training_step == "captured":
            mask = self.elmo.check_inputs(input_ids, attention_mask, state=state, values_checked_on_host=checked)
            sums, counts, *final_state = replay_training_step(
                self, input_ids, mask, labels, state, split_directions=split_directions, paths=paths
            )
            outputs = ElmoModelOutput(state=tuple(final_state) or None)
        else:
            options = {"state": state, "use_cache": use_cache, "output_hidden_states": output_hidden_states}
            if split_directions:
                mask = self.elmo.check_inputs(input_ids, attention_mask, state=state, values_checked_on_host=checked)
                outputs = self._split_directions_layers(input_ids, mask, **options)
            else:
                outputs = self.elmo(input_ids, attention_mask, values_checked_on_host=checked, **options)
            top = self.dropout(outputs.last_hidden_state)
            if labels is not None:
                sums, counts = self._loss_sums(top, labels, split_directions)
        loss = forward_loss = backward_loss = None
        if labels is not None:
            forward_loss, backward_loss = sums / counts.clamp(min=1)
            if num_items_in_batch is None:
                num_items_in_batch = counts.sum().clamp(min=1)
            loss = sums.sum() / num_items_in_batch
        forward_logits = backward_logits = None
        if return_logits:  # each direction's half of the top layer through the shared softmax
            forward_logits, backward_logits = (self.softmax(half) for half in top.chunk(2, dim=-1))
        return ElmoBiLMOutput(
            loss=loss,
            forward_loss=forward_loss,
            backward_loss=backward_loss,
            last_hidden_state=outputs.last_hidden_state if labels is None else None,
            forward_logits=forward_logits,
            backward_logits=backward_logits,
            hidden_states=outputs.hidden_states,
            state=outputs.state,
        )


def _rows_of_each_direction(forward: torch.Tensor, backward: torch.Tensor) -> torch.Tensor:
    """`(B/2, T, X)` of each direction -> `(B, T, 2X)`: forward rows `[forward | 0]`, then backward rows
    `[0 | backward]`."""
    width = forward.shape[-1]
    return torch.cat([F.pad(forward, (0, width)), F.pad(backward, (width, 0))])


def _states_of_each_direction(forward: torch.Tensor, backward: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """Final `(L, B/2, X)` of each direction -> `(L, B, 2X)`; the half a row's direction did not run keeps `start`'s
    `(L, B, 2X)` values."""
    half, width = forward.shape[1], forward.shape[-1]
    forward_rows = torch.cat([forward, start[:, :half, width:]], dim=-1)
    return torch.cat([forward_rows, torch.cat([start[:, half:, :width], backward], dim=-1)], dim=1)


class ElmoTaskPreTrainedModel(ElmoTaskFeaturesMixin, ElmoPreTrainedModel):
    """The paper's task models on the biLM: a ScalarMix of its layers (the biLM frozen by default), dropout, an optional
    BiLSTM task encoder with optional word vectors (`task_layers.py`), and a classifier, as `ElmoConfig` sets them."""

    has_classifier = True

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        # Head options may have been set after the config was built (from_pretrained(..., option=value)).
        config.validate_task_heads()
        self.elmo = ElmoModel(config)
        self.task_encoder = ElmoTaskEncoder(config)
        self._freeze_elmo()


class ElmoForSequenceClassification(ElmoTaskPreTrainedModel):
    """ELMo sentence classifier / regressor: task features pooled over the words, then a linear layer (loss by
    `config.problem_type`); with `config.sentence_pairs` each sentence of a pair on its own, then ESIM's comparison."""

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        pooled_size = self.task_encoder.output_size * (2 if config.classifier_pooling == "mean_max" else 1)
        self.pair_comparison = None
        if config.sentence_pairs:
            self.pair_comparison = ElmoPairComparison(config, self.task_encoder.output_size)
            pooled_size = self.pair_comparison.output_size
        self.classifier = nn.Linear(pooled_size, config.num_labels)
        self.post_init()

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
            input_ids (`(B, T, 50)`), attention_mask (`(B, T)`), input_word_ids (`(B, T)`): as for `ElmoModel`.
            labels (*optional*): `(B,)` class ids (single-label), `(B, num_labels)` 0/1 (multi-label) or floats of
                either shape (regression).
            elmo_hidden_states (`(B, T, num_layers + 1, 2P)`, *optional*): precomputed biLM layers
                (`data_elmo.ElmoLayerCache`); the biLM is not run when given.
            output_hidden_states (*optional*): also return the biLM's layers (of the first sentences of pairs).
            pair_*: the second sentences of pairs (`tokenizer(text, text_pair)`), for a pair classifier only.
        Returns `logits` `(B, num_labels)`, with labels the loss (plus the ScalarMix L2 penalty).
        """
        first = (input_ids, attention_mask, elmo_hidden_states, input_word_ids)
        if self.pair_comparison is not None:
            second = (pair_input_ids, pair_attention_mask, pair_elmo_hidden_states, pair_input_word_ids)
            (a, a_mask, layers), (b, b_mask, _) = self._pair_task_features(first, second)
            logits = self.classifier(self.pair_comparison(a, a_mask, b, b_mask))
        else:
            check_pair_given(type(self).__name__, pair_input_ids, reads_pairs=False)
            features, mask, layers = self._task_features(*first)
            logits = self.classifier(pool_words(features, word_mask(mask), self.config.classifier_pooling))
        loss = None
        if labels is not None:
            loss = self._add_l2_penalty(sequence_classification_loss(self.config, logits, labels))
        hidden_states = self._hidden_states(layers, output_hidden_states)
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=hidden_states)


class ElmoForTokenClassification(ElmoTaskPreTrainedModel):
    """ELMo tagger: `logits` `(B, T, num_labels)`, one per word at its position, 0 at `<S>`, `</S>` and padding."""

    # `pipeline(..., trust_remote_code=True)` uses it: the built-in one reads one id per token (`name_pipeline`).
    pipeline_class = ElmoTokenClassificationPipeline

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        self.classifier = nn.Linear(self.task_encoder.output_size, config.num_labels)
        self.post_init()

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
            input_ids, attention_mask, elmo_hidden_states, input_word_ids, output_hidden_states: as for the other heads.
            labels (`(B, T)`, *optional*): each word's class id at its position, -100 at `<S>`, `</S>` and padding.
        Returns `logits`, with labels their mean cross-entropy (plus the ScalarMix L2 penalty; NaN without any).
        """
        features, mask, layers = self._task_features(input_ids, attention_mask, elmo_hidden_states, input_word_ids)
        logits = (self.classifier(features) * word_mask(mask)[..., None]).roll(1, dims=1)  # word j to position j + 1
        loss = None
        if labels is not None:
            check_token_labels(labels, mask, self.config.num_labels)
            loss = self._add_l2_penalty(F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100))
        hidden_states = self._hidden_states(layers, output_hidden_states)
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=hidden_states)


class ElmoForQuestionAnswering(ElmoTaskPreTrainedModel):
    """ELMo answer spans as BiDAF's (Seo et al. 2017): question (`input_ids`) and context (`pair_input_ids`) each
    through the biLM and the task encoder, attention flow, two modelling BiLSTMs, start and end logits `(B, Tc)` over
    the positions of `pair_input_ids` (word `j` at `j + 1`, 0 the empty answer as BERT's `[CLS]`, `</S>` and padding
    the dtype's lowest value). `ElmoQuestionAnsweringPipeline` decodes spans."""

    # As for the tagger.
    pipeline_class = ElmoQuestionAnsweringPipeline

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
            pair_*: the contexts (`tokenizer(questions, contexts)` gives both).
            start_positions, end_positions (`(B,)`, *optional*): the answer's first and last word as positions of
                `pair_input_ids`, 0 for no answer.
        Returns the logits, with positions the mean of both cross-entropies (plus the ScalarMix L2 penalty).
        """
        first = (input_ids, attention_mask, elmo_hidden_states, input_word_ids)
        second = (pair_input_ids, pair_attention_mask, pair_elmo_hidden_states, pair_input_word_ids)
        (question, question_mask, layers), (context, context_mask, _) = self._pair_task_features(first, second)
        flow = attention_flow(self.similarity, context, context_mask, question, question_mask)
        modeled = run_lstm(self.modeling, self.dropout(flow), context_mask)
        end_modeled = run_lstm(self.end_modeling, self.dropout(modeled), context_mask)
        start_features = self.dropout(torch.cat([flow, modeled], dim=-1))
        end_features = self.dropout(torch.cat([flow, end_modeled], dim=-1))
        lowest = torch.finfo(flow.dtype).min
        no_answer = self.no_answer_output(start_features.masked_fill(~context_mask[..., None], lowest).amax(dim=1))
        start_logits = answer_position_logits(self.start_output(start_features), no_answer[:, 0], context_mask, lowest)
        end_logits = answer_position_logits(self.end_output(end_features), no_answer[:, 1], context_mask, lowest)
        check_answer_positions(start_positions, end_positions, context_mask)
        loss = None
        if start_positions is not None:
            loss = (F.cross_entropy(start_logits, start_positions) + F.cross_entropy(end_logits, end_positions)) / 2
            loss = self._add_l2_penalty(loss)
        hidden_states = self._hidden_states(layers, output_hidden_states)
        return QuestionAnsweringModelOutput(
            loss=loss, start_logits=start_logits, end_logits=end_logits, hidden_states=hidden_states
        )


__all__ = [
    "ElmoBiLMOutput",
    "ElmoCharacterEncoder",
    "ElmoForBiLM",
    "ElmoForQuestionAnswering",
    "ElmoForSequenceClassification",
    "ElmoForTokenClassification",
    "ElmoModel",
    "ElmoModelOutput",
    "ElmoPreTrainedModel",
    "ElmoState",
    "ElmoTaskPreTrainedModel",
]
