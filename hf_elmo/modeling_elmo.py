"""PyTorch ELMo: character CNN, highway, projection and a bidirectional LSTM language model.

Numerically equivalent to AllenNLP's `_ElmoBiLm` (and bilm-tf) for converted weights; see
`conversion/convert_original_elmo.py` for the weight mapping. Unlike those implementations the model
is stateless by default: the LSTM state is passed in and returned explicitly.
"""

import glob
import json
import math
import os
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from huggingface_hub.errors import StrictDataclassError
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import SequenceClassifierOutput, TokenClassifierOutput
from transformers.utils import ModelOutput, can_return_tuple

from .configuration_elmo import PROBLEM_TYPES, ElmoConfig
from .cpu_threads import can_run_concurrently, run_concurrently
from .cuda_graphs import CaptureCache, CapturedFunction
from .fast_lstm import lstm_direction
from .gpu_lstm import CapturedLayers, LayerSettings, bidirectional_layer, default_kernels
from .hub_elmo import push_to_hub_with_model_card
from .onednn_linear import linear

# Not used here: importing it makes save_pretrained copy its file next to this one, where the tagger's
# config.custom_pipelines points remote-code users to it.
from .pipelines_elmo import ElmoTokenClassificationPipeline  # noqa: F401
from .sampled_softmax import full_softmax_loss, sampled_softmax_loss
from .scalar_mix import ScalarMix
from .tokenization_elmo import BOS_WORD_IDS, EOS_WORD_IDS, words_to_char_ids

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

    With `config.input_word_dim > 0` (ELMoForManyLangs models) each word's embedding is looked up from its
    word id too and concatenated before the CNN features, `[word | characters]`, ahead of the projection.
    """

    # Words are grouped by how many leading slots need real windows, rounded up to this many, so that a
    # long word does not make every short word's windows long.
    SPAN_GRANULARITY = 8
    # Fewer distinct words than this per thread are not worth a second thread.
    MIN_WORDS_PER_THREAD = 16

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
        # Whether to compute each distinct word once (`None`: on CPUs, where it saves work; GPUs would wait for
        # the host to sort and group the words).
        self.deduplicate: bool | None = None

    def forward(self, char_ids: torch.LongTensor, word_ids: torch.LongTensor | None = None) -> torch.Tensor:
        """`(..., C)` character ids (and `(...)` word ids with word embeddings) -> `(..., P)`."""
        deduplicate = self.deduplicate if self.deduplicate is not None else not char_ids.is_cuda
        if not deduplicate:
            return self._forward_every_token(char_ids, word_ids)
        batch_shape, num_chars = char_ids.shape[:-1], char_ids.shape[-1]
        words, word_index = torch.unique(char_ids.reshape(-1, num_chars), dim=0, return_inverse=True)
        spans, order = _spans(words).sort()
        words, spans = words[order], spans.tolist()
        if can_run_concurrently(words) and len(spans) >= 2 * self.MIN_WORDS_PER_THREAD:
            # Every other word to each thread: both get as many short and long words.
            halves = run_concurrently(
                lambda: self._embed_sorted_words(words[0::2], spans[0::2]),
                lambda: self._embed_sorted_words(words[1::2], spans[1::2]),
            )
            per_word = halves[0].new_empty(len(spans), halves[0].shape[1])
            per_word[0::2], per_word[1::2] = halves
        else:
            per_word = self._embed_sorted_words(words, spans)
        sorted_position = torch.empty_like(order)
        sorted_position[order] = torch.arange(len(order), device=order.device)
        per_token = per_word[sorted_position[word_index]]
        if self.word_embedding is not None:
            per_token = torch.cat([self.word_embedding(word_ids.reshape(-1)), per_token], dim=-1)
            per_token = linear(per_token, self.projection.weight, self.projection.bias)
        return per_token.reshape(*batch_shape, -1)

    def _forward_every_token(self, char_ids: torch.LongTensor, word_ids: torch.LongTensor | None) -> torch.Tensor:
        """`forward` without looking for repeated words, for GPUs: the same operations whatever the input, and one
        synchronisation with the host (the longest span) instead of a sort and a list of spans."""
        batch_shape, num_chars = char_ids.shape[:-1], char_ids.shape[-1]
        words = char_ids.reshape(-1, num_chars)
        # While a CUDA graph is captured the span cannot be read: every window, which the graph can replay anyway.
        capturing = words.is_cuda and torch.cuda.is_current_stream_capturing()
        longest = num_chars if capturing else int(_spans(words).max())
        features = self._max_over_windows_of_group(words, longest, self._run_values(words))
        for highway in self.highways:
            features = highway(features)
        if self.word_embedding is not None:
            features = torch.cat([self.word_embedding(word_ids.reshape(-1)), features], dim=-1)
        return linear(features, self.projection.weight, self.projection.bias).reshape(*batch_shape, -1)

    def _embed_sorted_words(self, words: torch.LongTensor, spans: list[int]) -> torch.Tensor:
        """`(U, C)` distinct words sorted by span, with their spans -> their token embeddings `(U, P)`, or their
        highway outputs `(U, F)` when word embeddings join them before the projection."""
        features = self._max_over_windows(words, spans)
        for highway in self.highways:
            features = highway(features)
        if self.word_embedding is None:  # the projection depends on the characters only: once per distinct word
            return linear(features, self.projection.weight, self.projection.bias)
        return features

    def _max_over_windows(self, words: torch.LongTensor, spans: list[int]) -> torch.Tensor:
        """`(U, C)` words sorted by span, with their spans -> activated CNN features `(U, F)`."""
        run_values = self._run_values(words)
        return torch.cat(
            [
                self._max_over_windows_of_group(words[start:end], span, [v[start:end] for v in run_values])
                for start, end, span in _span_groups(spans, self.SPAN_GRANULARITY)
            ]
        )

    def _run_values(self, words: torch.LongTensor) -> list[torch.Tensor]:
        """A window inside a word's final run of one character: the kernel summed over its width times the run's
        character, `(U, n)` per filter."""
        final_char = self.char_embedding(words[:, -1])  # (U, e)
        return [linear(final_char, conv.weight.sum(dim=-1)) for conv in self.convolutions]

    def _max_over_windows_of_group(
        self, words: torch.LongTensor, span: int, run_values: list[torch.Tensor]
    ) -> torch.Tensor:
        """`(u, C)` words whose spans are at most `span` -> activated CNN features `(u, F)`."""
        num_chars = words.shape[1]
        max_width = max(conv.kernel_size[0] for conv in self.convolutions)
        chars = self.char_embedding(words[:, : min(span + max_width - 1, num_chars)])  # (u, L, e)
        per_filter = []
        for conv, value in zip(self.convolutions, run_values):
            width = conv.kernel_size[0]
            num_windows = min(span, num_chars - width + 1)
            if num_windows > 0:
                # max, not amax: its backward is one scatter (ties are identical windows, which give the weights
                # the same gradient whichever of them takes it).
                # Matrix products of the windows rather than cuDNN's convolutions: never rounded to TF32 (cuDNN's
                # float32 default), and on an H100 faster in bfloat16 too (cuDNN transposes these narrow inputs).
                windows = chars[:, : num_windows + width - 1].unfold(1, width, 1)  # (u, windows, e, width)
                window_max = linear(windows.flatten(2), conv.weight.flatten(1)).max(dim=1).values
                # Windows from `span` on lie inside the final run; if the word has any, their value counts.
                if num_windows < num_chars - width + 1:
                    # `where`, not `maximum`: cheaper backward, and a tie gives the weights the same gradient either way.
                    window_max = torch.where(window_max > value, window_max, value)
                value = window_max
            per_filter.append(value)
        bias = torch.cat([conv.bias for conv in self.convolutions])
        # The bias and the activation commute with the max: rounding and both activations are monotonic.
        return self.activation(torch.cat(per_filter, dim=-1) + bias)


def _spans(words: torch.LongTensor) -> torch.LongTensor:
    """`(U, C)` character ids -> `(U,)` slots up to the last one that differs from the final slot (0 when all
    slots hold one character): windows beyond a word's span see only its final run."""
    num_chars = words.shape[1]
    differs = words != words[:, -1:]
    return torch.where(differs, torch.arange(1, num_chars + 1, device=words.device), 0).amax(dim=1)


def _span_groups(spans: list[int], granularity: int) -> list[tuple[int, int, int]]:
    """Runs of ascending `spans` that round up to the same multiple of `granularity`: `(start, end, longest)`."""
    groups, start = [], 0
    for end in range(1, len(spans) + 1):
        rounded = (spans[start] + granularity - 1) // granularity
        if end == len(spans) or (spans[end] + granularity - 1) // granularity != rounded:
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
        self.forget_bias = config.forget_bias
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
        bias = self.state_linearity.bias
        if self.forget_bias:  # added at run time, as TensorFlow's LSTMCell does: here once, into the input products
            forget_bias = torch.zeros_like(bias)
            forget_bias[self.cell_dim : 2 * self.cell_dim] = self.forget_bias
            bias = bias + forget_bias
        # The input-to-gate products of all steps are one matrix product; only W_h h is sequential.
        gate_inputs = linear(inputs, self.input_linearity.weight, bias)
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
    """Two independent stacks of `ElmoLstmLayer`; the directions meet only in the outputs.

    Two implementations of the same computation: on CPUs the rows are sorted by length and each step
    multiplies only the rows still running (`fast_lstm.py`); on GPUs both directions of a layer step together
    over the whole batch with masks, so that shapes are static and a layer's time loops can be replayed as CUDA
    graphs (`gpu_lstm.py`). `static_shapes` picks one (`None`: by device).
    """

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.use_skip_connections = config.use_skip_connections
        self.dropout = nn.Dropout(config.dropout)
        self.forward_layers = nn.ModuleList(ElmoLstmLayer(config) for _ in range(config.num_layers))
        self.backward_layers = nn.ModuleList(ElmoLstmLayer(config) for _ in range(config.num_layers))
        self.static_shapes: bool | None = None
        self.elementwise_kernels: str | None = None  # "triton" or "torch"; None: Triton on CUDA
        self.use_cuda_graphs = True
        self.captured = CapturedLayers()

    def _apply(self, fn, recurse=True):
        self.captured.clear()  # graphs read the parameters at the addresses they had when captured
        return super()._apply(fn, recurse)

    def forward(
        self, token_embeddings: torch.Tensor, mask: torch.BoolTensor, state: ElmoState
    ) -> tuple[list[torch.Tensor], ElmoState]:
        """`(B, T, P)` embeddings, `(B, T)` right-padded mask -> `num_layers` outputs `(B, T, 2P)` (0 at
        padding) and the final state."""
        static_shapes = self.static_shapes if self.static_shapes is not None else token_embeddings.is_cuda
        if static_shapes:
            return self._forward_static(token_embeddings, mask, state)
        return self._forward_sorted(token_embeddings, mask, state)

    def _forward_static(
        self, token_embeddings: torch.Tensor, mask: torch.BoolTensor, state: ElmoState
    ) -> tuple[list[torch.Tensor], ElmoState]:
        batch_size, num_steps, projection_dim = token_embeddings.shape
        device = token_embeddings.device
        first = self.forward_layers[0]
        if torch.is_autocast_enabled(device.type):
            dtype = torch.get_autocast_dtype(device.type)
        else:
            dtype = first.state_linearity.weight.dtype
        # Step order: direction 1 runs over reversed time, so step s of both directions is one batched step.
        time_major = token_embeddings.transpose(0, 1)
        inputs = torch.stack([time_major, time_major.flip(0)])  # (2, T, B, P)
        step_mask = torch.zeros(2, num_steps + 1, batch_size, dtype=torch.uint8, device=device)
        step_mask[0, :num_steps] = mask.t()
        step_mask[1, :num_steps] = mask.t().flip(0)
        hidden, memory = state
        kernels = self.elementwise_kernels or default_kernels(device)
        captured = self.captured if self.use_cuda_graphs else None
        layer_outputs, final_hidden, final_memory = [], [], []
        for index, (forward_layer, backward_layer) in enumerate(zip(self.forward_layers, self.backward_layers)):
            settings = LayerSettings(
                forward_layer.cell_clip, forward_layer.proj_clip, forward_layer.forget_bias or 0.0, dtype, kernels
            )
            weights = tuple(
                weight
                for name in ("input_linearity.weight", "state_linearity.bias", "state_linearity.weight",
                             "state_projection.weight")
                for weight in (forward_layer.get_parameter(name), backward_layer.get_parameter(name))
            )  # fmt: skip
            # bilm-tf wraps every cell, residual included, in input dropout.
            layer_in = self.dropout(inputs)
            hidden0 = hidden[index].view(batch_size, 2, projection_dim).transpose(0, 1)
            memory0 = memory[index].view(batch_size, 2, -1).transpose(0, 1)
            outputs, layer_hidden, layer_memory = bidirectional_layer(
                layer_in, step_mask, hidden0, memory0, weights, settings, captured, index
            )
            if self.use_skip_connections and index > 0:
                outputs = outputs + layer_in
            inputs = outputs
            layer_output = outputs.new_empty(batch_size, num_steps, 2 * projection_dim)  # (B, T, [forward | backward])
            layer_output[..., :projection_dim] = outputs[0].transpose(0, 1)
            layer_output[..., projection_dim:] = outputs[1].flip(0).transpose(0, 1)
            layer_outputs.append(layer_output)
            final_hidden.append(layer_hidden.transpose(0, 1).reshape(batch_size, -1))
            final_memory.append(layer_memory.transpose(0, 1).reshape(batch_size, -1))
        final_state = (torch.stack(final_hidden).to(hidden.dtype), torch.stack(final_memory).to(memory.dtype))
        return layer_outputs, final_state

    def _forward_sorted(
        self, token_embeddings: torch.Tensor, mask: torch.BoolTensor, state: ElmoState
    ) -> tuple[list[torch.Tensor], ElmoState]:
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
            directions = (  # the loop copies each state half into a contiguous buffer of its own
                partial(forward_layer, forward_in, forward_hidden, forward_memory, batch_sizes, False),
                partial(backward_layer, backward_in, backward_hidden, backward_memory, batch_sizes, True),
            )
            if can_run_concurrently(forward_in):
                forward_result, backward_result = run_concurrently(*directions)
            else:
                forward_result, backward_result = (direction() for direction in directions)
            forward_out, forward_hidden, forward_memory = forward_result
            backward_out, backward_hidden, backward_memory = backward_result
            if self.use_skip_connections and index > 0:
                forward_out = forward_out + forward_in
                backward_out = backward_out + backward_in
            forward_in, backward_in = forward_out, backward_out
            layer_outputs.append(torch.cat([forward_out, backward_out], dim=-1).transpose(0, 1))
            final_hidden.append(torch.cat([forward_hidden, backward_hidden], dim=-1))
            final_memory.append(torch.cat([forward_memory, backward_memory], dim=-1))
        # In the state's dtype, also under autocast, so that it can be passed back.
        final_state = (torch.stack(final_hidden).to(hidden.dtype), torch.stack(final_memory).to(memory.dtype))
        if order is not None:
            restore = torch.empty_like(order)
            restore[order] = torch.arange(len(order), device=order.device)
            layer_outputs = [output[restore] for output in layer_outputs]
            final_state = (final_state[0][:, restore], final_state[1][:, restore])
        else:
            layer_outputs = [output.contiguous() for output in layer_outputs]
        return layer_outputs, final_state


_PICKLE_REFUSED = (
    "ELMo loads weights only from safetensors by default, because a pickle checkpoint (pytorch_model.bin) can run "
    "code hidden in it while loading. If you trust its origin, pass use_safetensors=False explicitly."
)


_HUB_KEYS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")
_BILM_PREFIXES = ("char_encoder.", "encoder.")


def _safetensors_shapes(files: list[str]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in safetensors files, read from their headers (no tensor data is read)."""
    from safetensors import safe_open

    shapes = {}
    for file in files:
        try:
            with safe_open(file, framework="pt") as tensors:
                shapes.update((name, tuple(tensors.get_slice(name).get_shape())) for name in tensors.keys())
        except Exception as error:  # safetensors raises its own error type, OSError or ValueError
            raise OSError(f"{file}: not a readable safetensors file ({' '.join(str(error).split())})") from None
    return shapes


def _check_weights_before_loading(cls, path, kwargs):
    """Compares the model the configuration describes with the tensors on disk (their headers), before transformers
    allocates anything. A `ValueError` naming the tensor for: a biLM tensor of another shape (or a softmax of another
    vocabulary size), one the configuration has no place for (e.g. a third LSTM layer), and a missing one that
    transformers would fill with fresh values with only a warning: any biLM tensor, and any tensor at all when the
    folder was saved from this very class (a new task head or softmax is what loading into another class is for)."""
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, cached_file

    hub = {key: kwargs[key] for key in _HUB_KEYS if key in kwargs}
    locate = partial(cached_file, path, _raise_exceptions_for_missing_entries=False, **hub)
    files = [locate(SAFE_WEIGHTS_NAME)]
    if files[0] is None:
        index = locate(SAFE_WEIGHTS_INDEX_NAME)
        if index is None:
            return  # transformers reports the missing weights
        with open(index, encoding="utf-8") as f:
            files = [locate(shard) for shard in sorted(set(json.load(f)["weight_map"].values()))]
    config = kwargs.get("config")
    if not isinstance(config, PreTrainedConfig):
        try:
            config = cls.config_class.from_pretrained(path, **{k: v for k, v in kwargs.items() if k != "config"})
        except StrictDataclassError as error:  # a validator's ValueError, wrapped by huggingface_hub
            raise ValueError(f"{path}: config.json: {error.__cause__ or error}") from None
        config = config[0] if isinstance(config, tuple) else config
    prefix = f"{cls.base_model_prefix}."
    on_disk = {name.removeprefix(prefix): shape for name, shape in _safetensors_shapes(files).items()}
    with torch.device("meta"):
        expected = {name.removeprefix(prefix): tuple(t.shape) for name, t in cls(config).state_dict().items()}
    bilm = [name for name in expected if name.startswith(_BILM_PREFIXES)]
    required = expected if cls.__name__ in (config.architectures or []) else bilm
    where = f"{path}: the weights ({os.path.basename(files[0])})"
    missing = [name for name in required if name not in on_disk]
    if missing:
        raise ValueError(
            f"{where} lack {len(missing)} tensor(s) of the model that config.json describes, e.g. '{missing[0]}' "
            f"{expected[missing[0]]}"
        )
    extra = [name for name in on_disk if name.startswith(_BILM_PREFIXES) and name not in expected]
    if extra:
        raise ValueError(
            f"{where} hold '{extra[0]}', which the biLM of config.json (num_layers={config.num_layers}, "
            f"n_highway={config.n_highway}, {len(config.filters)} filters) has no place for"
        )
    for name in [*bilm, "softmax.weight", "softmax.bias"]:
        if name in on_disk and name in expected and on_disk[name] != expected[name]:
            raise ValueError(
                f"{where} hold '{name}' of shape {on_disk[name]}, but config.json implies {expected[name]}: the "
                "configuration and the weights do not belong together"
            )


class ElmoPreTrainedModel(PreTrainedModel):
    config_class = ElmoConfig
    config: ElmoConfig
    base_model_prefix = "elmo"
    main_input_name = "input_ids"
    _no_split_modules = ["ElmoBiLstm"]
    _is_stateful = True
    # A pre-training checkpoint (`ElmoForBiLM`) holds the word softmax, which other heads leave out on purpose.
    _keys_to_ignore_on_load_unexpected = [r"^softmax\."]

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, use_safetensors: bool | None = None, **kwargs):
        """`PreTrainedModel.from_pretrained` that reads weights only from safetensors unless `use_safetensors=False`.

        A pickle checkpoint (`pytorch_model.bin`) is a program that runs while it is read; transformers restricts
        it with `weights_only`, but that unpickler has had escapes. Loading one therefore needs the explicit
        `use_safetensors=False` (and is best followed by `save_pretrained`, which writes safetensors).
        """
        if use_safetensors is None:
            path = str(pretrained_model_name_or_path)
            folder = os.path.join(path, kwargs.get("subfolder", ""))
            only_pickles = os.path.isdir(folder) and not glob.glob(os.path.join(folder, "*.safetensors*"))
            if (os.path.isfile(path) and not path.endswith(".safetensors")) or (
                only_pickles and glob.glob(os.path.join(folder, "*.bin"))
            ):
                raise OSError(f"{path}: {_PICKLE_REFUSED}")
        if use_safetensors is not False:
            _check_weights_before_loading(cls, pretrained_model_name_or_path, kwargs)
        try:
            loaded = super().from_pretrained(
                pretrained_model_name_or_path, *model_args, use_safetensors=use_safetensors is not False, **kwargs
            )
        except OSError as error:
            # a Hub repo without safetensors: transformers' hint ("do not set use_safetensors=True") misleads
            if use_safetensors is not None or "use_safetensors" not in str(error):
                raise
            raise OSError(f"{pretrained_model_name_or_path}: {_PICKLE_REFUSED}") from None
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        # Weights read from safetensors are views into the mapped file at offsets that need not be 64-byte aligned,
        # and some CPU kernels (nn.LSTM's) round differently on such memory: copying them makes a reloaded model
        # compute bit for bit what the saved one did.
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.data_ptr() % 64:
                tensor.data = tensor.data.clone()
        # A NaN or infinite weight makes every output NaN without a word: refused (one transfer for all tensors).
        named = [(name, t) for name, t in model.named_parameters() if t.is_floating_point() and t.device.type != "meta"]
        if named and not torch.stack([torch.isfinite(t).all() for _, t in named]).all():
            name = next(name for name, t in named if not torch.isfinite(t).all())
            raise ValueError(f"{pretrained_model_name_or_path}: the weights hold NaN or infinite values in '{name}'")
        return loaded

    def push_to_hub(self, repo_id: str, **kwargs):
        """`PreTrainedModel.push_to_hub` (weights, config, remote code of every class) whose README, in a repository
        without one, is the ELMo model card (`model_card.md`). Extra arguments `datasets` and `license` fill the
        card's metadata."""
        return push_to_hub_with_model_card(self, repo_id, **kwargs)

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
        has_word = (input_ids > 0).any(dim=-1)  # padding positions are all-zero rows
        if attention_mask is None:
            mask = has_word
        else:
            if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape[:2]:
                got = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask)
                raise ValueError(
                    f"attention_mask must have shape {tuple(input_ids.shape[:2])} (batch, words), got {got}."
                )
            mask = attention_mask.bool()
        lengths = mask.sum(dim=1, keepdim=True)
        ragged = (mask != (torch.arange(mask.shape[1], device=mask.device) < lengths)).any()
        over_padding = (mask & ~has_word).any()  # a mask of 1 over an all-zero row: padding read as a word
        # One transfer for all value checks: on a GPU each transfer makes the host wait for the device.
        low, high, ragged, over_padding = torch.stack(
            [input_ids.min().long(), input_ids.max().long(), ragged.long(), over_padding.long()]
        ).tolist()
        if low < 0 or high >= config.n_characters:
            raise ValueError(
                f"input_ids must be in [0, {config.n_characters - 1}], found values in [{low}, {high}]; were they "
                "made by this model's tokenizer?"
            )
        if ragged:
            raise ValueError("ELMo needs right-padded input: every attention_mask row must be ones then zeros.")
        if over_padding:
            row, position = (mask & ~has_word).nonzero()[0].tolist()
            raise ValueError(
                f"attention_mask is 1 at row {row}, position {position}, whose input_ids are all zeros (padding): the "
                "LSTM would read the padding as a word. Pass the tokenizer's attention_mask."
            )
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
        return self._forward_checked(input_ids, mask, state, use_cache, output_hidden_states, input_word_ids)

    def _forward_checked(
        self, input_ids, mask, state, use_cache, output_hidden_states, input_word_ids=None
    ) -> ElmoModelOutput:
        """`forward` after `_check_inputs`: no host synchronisation on a GPU beyond the character CNN's (none while
        a CUDA graph is being captured)."""
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
        self._captured_steps = CaptureCache(max_entries=2)  # training steps by shape (`_captured_training_step`)
        self.post_init()

    # Beyond this many positions per batch (e.g. 512 rows of 20) a GPU stays busy with operations issued one by one,
    # and a captured step would only hold its memory twice.
    _MAX_CAPTURED_POSITIONS = 12_288

    def _apply(self, fn, recurse=True):
        self._captured_steps.clear()  # graphs read the parameters at the addresses they had when captured
        return super()._apply(fn, recurse)

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

    def _loss_sums(self, top: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(B, T, 2P)` top layer (after dropout) and `(B, T, 2)` labels -> the summed cross-entropy `(2,)` and the
        number of targets `(2,)` of the forward and the backward LM."""
        forward_hidden, backward_hidden = top.chunk(2, dim=-1)
        hidden = torch.cat([forward_hidden.flatten(0, 1), backward_hidden.flatten(0, 1)])  # (2 B T, P)
        targets = torch.cat([labels[..., 0].flatten(), labels[..., 1].flatten()]).long()
        has_target = targets != -100
        # Every position is scored and the ones without a target are dropped from the sums: shapes then do not
        # depend on the data, so a GPU never waits for the host to count targets.
        targets = targets.masked_fill(~has_target, 0)
        if self.training and self.uses_sampled_softmax():
            losses = sampled_softmax_loss(
                hidden, targets, self.softmax.weight, self.softmax.bias, self.config.num_softmax_samples
            )
        else:
            losses = full_softmax_loss(hidden, targets, self.softmax.weight, self.softmax.bias)
        sums = torch.where(has_target, losses, 0.0).view(2, -1).sum(dim=1)
        return sums, has_target.view(2, -1).sum(dim=1)

    def _training_step_sums(self, input_ids, mask, labels):
        outputs = self.elmo._forward_checked(input_ids, mask, None, False, False)
        return self._loss_sums(self.dropout(outputs.last_hidden_state), labels)

    def _captured_training_step(self, input_ids, attention_mask, labels):
        """`_loss_sums` of a training batch replayed from CUDA graphs (`cuda_graphs.py`): a step of a GPU-sized batch
        is otherwise a few thousand operations that the host issues more slowly than the GPU runs them. None where
        that does not apply (CPU, evaluation, states or word embeddings, graphs turned off, a batch large enough to
        keep the GPU busy without them) or when this shape is seen for the first time."""
        elmo = self.elmo
        if not (
            self.training
            and isinstance(input_ids, torch.Tensor)
            and input_ids.is_cuda
            and elmo.encoder.use_cuda_graphs
            and not self.config.input_word_dim
            and input_ids.shape[0] * input_ids.shape[1] <= self._MAX_CAPTURED_POSITIONS
            and not torch.cuda.is_current_stream_capturing()
        ):
            return None
        mask = elmo._check_inputs(input_ids, attention_mask, None)
        autocast = torch.is_autocast_enabled("cuda")
        params = [p for p in self.parameters() if p.requires_grad]
        key = (
            tuple(input_ids.shape), input_ids.dtype, labels.dtype, input_ids.device, autocast,
            torch.get_autocast_dtype("cuda"), tuple(p.data_ptr() for p in params), self.dropout.p,
            elmo.encoder.dropout.p, torch.backends.cuda.matmul.allow_tf32,
        )  # fmt: skip
        def capture():
            # The autocast cache would hand the graph casts of the weights made before it, never updated.
            with torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), enabled=autocast, cache_enabled=False):
                return CapturedFunction(self._training_step_sums, (input_ids, mask, labels), params)

        captured = self._captured_steps.get_or_capture(key, capture)
        if captured is None:
            return None
        if captured.busy:
            return None
        return captured.replay(input_ids, mask, labels)

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
        if labels is not None and isinstance(input_ids, torch.Tensor):
            # Before the model runs: on a GPU the check waits for the device, which is idle only now.
            self._check_labels(labels, input_ids.shape[:2])
        captured = None
        if labels is not None and not (return_logits or output_hidden_states):
            captured = self._captured_training_step(input_ids, attention_mask, labels)
        if captured is not None:
            sums, counts = captured
            outputs = ElmoModelOutput()
        else:
            outputs = self.elmo(input_ids, attention_mask=attention_mask, output_hidden_states=output_hidden_states)
            top = self.dropout(outputs.last_hidden_state)
            if labels is not None:
                sums, counts = self._loss_sums(top, labels)

        loss = forward_loss = backward_loss = None
        if labels is not None:
            forward_loss, backward_loss = sums / counts.clamp(min=1)
            if num_items_in_batch is None:
                num_items_in_batch = counts.sum().clamp(min=1)
            loss = sums.sum() / num_items_in_batch

        forward_logits = backward_logits = None
        if return_logits:
            forward_hidden, backward_hidden = top.chunk(2, dim=-1)
            forward_logits, backward_logits = self.softmax(forward_hidden), self.softmax(backward_hidden)
        return ElmoBiLMOutput(
            loss=loss,
            forward_loss=forward_loss,
            backward_loss=backward_loss,
            forward_logits=forward_logits,
            backward_logits=backward_logits,
            hidden_states=outputs.hidden_states,
        )


__all__ = ["ElmoModel", "ElmoPreTrainedModel", "ElmoModelOutput", "ElmoState", "ElmoCharacterEncoder",
           "ElmoForBiLM", "ElmoBiLMOutput"]


# --- downstream task heads ------------------------------------------------------------------------

_ASCII_UPPER = (ord("A") + 1, ord("Z") + 1)  # character ids of 'A' and 'Z' (byte + 1)
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
        keys = _word_keys(torch.from_numpy(words_to_char_ids(words)), self.lowercase)
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

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        # Head options may have been set after the config was built (from_pretrained(..., option=value)).
        config.validate_task_heads()
        self.elmo = ElmoModel(config)
        self.task_encoder = ElmoTaskEncoder(config)
        self._freeze_elmo()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """`PreTrainedModel.from_pretrained`, refusing up front to load a saved head's classifier into a different
        number of labels (transformers only logs the shapes), unless `ignore_mismatched_sizes=True`."""
        config = kwargs.get("config")
        if isinstance(config, PreTrainedConfig):  # the Auto classes pass the config they built from the kwargs
            requested = config.num_labels
        else:
            requested = len(kwargs["id2label"]) if kwargs.get("id2label") else kwargs.get("num_labels")
        if requested is not None and not kwargs.get("ignore_mismatched_sizes"):
            hub_keys = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")
            saved, _ = cls.config_class.get_config_dict(
                pretrained_model_name_or_path, **{key: kwargs[key] for key in hub_keys if key in kwargs}
            )
            saved_labels = len(saved["id2label"]) if saved.get("id2label") else saved.get("num_labels", 2)
            heads = {"ElmoForSequenceClassification", "ElmoForTokenClassification"}
            if heads & set(saved.get("architectures") or []) and saved_labels != requested:
                raise ValueError(
                    f"{pretrained_model_name_or_path} holds a classifier for {saved_labels} labels but {requested} "
                    "labels were requested. Load it without num_labels/id2label to keep its classifier, or pass "
                    f"ignore_mismatched_sizes=True to replace the classifier with a new one for {requested} labels."
                )
        return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)

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
        self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, elmo_hidden_states: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.BoolTensor]:
        """Word features `(B, T - 2, F)` and the `(B, T)` mask of real positions (boundaries included)."""
        mask = self.elmo._check_inputs(input_ids, attention_mask, None)
        first, last = input_ids[:, 0], input_ids[torch.arange(len(input_ids)), mask.sum(dim=1) - 1]
        if not ((first == first.new_tensor(BOS_WORD_IDS)).all() and (last == last.new_tensor(EOS_WORD_IDS)).all()):
            raise ValueError(
                "The task heads need every sentence framed by the <S> and </S> rows (positions 0 and length - 1): "
                "tokenize with ElmoTokenizer and add_special_tokens=True (the default)."
            )
        if elmo_hidden_states is None:
            with torch.set_grad_enabled(torch.is_grad_enabled() and not self.config.freeze_elmo):
                layers = self.elmo(input_ids, attention_mask=mask, output_hidden_states=True).hidden_states
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
        return self.task_encoder(input_ids, elmo_hidden_states, mask), mask

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
    ) -> SequenceClassifierOutput:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(B, T, 50)`): character ids from `ElmoTokenizer`, with `<S>`/`</S>`.
            attention_mask (`torch.Tensor` of shape `(B, T)`, *optional*): 1 at real positions (right padding).
            labels (*optional*): `(B,)` class ids (single-label), `(B, num_labels)` 0/1 (multi-label) or `(B,)` /
                `(B, num_labels)` floats (regression).
            elmo_hidden_states (`torch.Tensor` of shape `(B, T, num_layers + 1, 2P)`, *optional*): precomputed biLM
                layers (see `hf_elmo.data_elmo.ElmoLayerCache`); the biLM is not run when given.

        Returns:
            `SequenceClassifierOutput` with `logits` `(B, num_labels)` and, with labels, the loss (plus the ScalarMix L2
            penalty when `config.scalar_mix_l2 > 0`).
        """
        features, mask = self._task_features(input_ids, attention_mask, elmo_hidden_states)
        logits = self.classifier(self._pool(features, mask[:, 2:]))
        loss = None if labels is None else self._add_l2_penalty(self._loss(logits, labels))
        return SequenceClassifierOutput(loss=loss, logits=logits)


class ElmoForTokenClassification(ElmoTaskPreTrainedModel):
    """ELMo tagger: one prediction per word, at the word's input position.

    `logits` are `(B, T, num_labels)` over the input positions like every transformers token classifier; positions of
    `<S>`, `</S>` and padding get 0 and must be labelled -100.
    """

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        self.classifier = nn.Linear(self.task_encoder.output_size, config.num_labels)
        # `pipeline("token-classification", model=<folder or repo>, trust_remote_code=True)` then uses the pipeline
        # that understands 3-D character ids instead of the built-in one.
        config.custom_pipelines = {
            "token-classification": {
                "impl": "pipelines_elmo.ElmoTokenClassificationPipeline",
                "pt": ["AutoModelForTokenClassification"],
                "type": "text",
            }
        }
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

    def _loss_sums(self, top: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(B, T, 2P)` top layer (after dropout) and `(B, T, 2)` labels -> the summed cross-entropy `(2,)` and the
        number of targets `(2,)` of the forward and the backward LM."""
        forward_hidden, backward_hidden = top.chunk(2, dim=-1)
        hidden = torch.cat([forward_hidden.flatten(0, 1), backward_hidden.flatten(0, 1)])  # (2 B T, P)
        targets = torch.cat([labels[..., 0].flatten(), labels[..., 1].flatten()]).long()
        has_target = targets != -100
        # Every position is scored and the ones without a target are dropped from the sums: shapes then do not
        # depend on the data, so a GPU never waits for the host to count targets.
        targets = targets.masked_fill(~has_target, 0)
        if self.training and self.uses_sampled_softmax():
            losses = sampled_softmax_loss(
                hidden, targets, self.softmax.weight, self.softmax.bias, self.config.num_softmax_samples
            )
        else:
            losses = full_softmax_loss(hidden, targets, self.softmax.weight, self.softmax.bias)
        sums = torch.where(has_target, losses, 0.0).view(2, -1).sum(dim=1)
        return sums, has_target.view(2, -1).sum(dim=1)

    def _training_step_sums(self, input_ids, mask, labels):
        outputs = self.elmo._forward_checked(input_ids, mask, None, False, False)
        return self._loss_sums(self.dropout(outputs.last_hidden_state), labels)

    def _captured_training_step(self, input_ids, attention_mask, labels):
        """`_loss_sums` of a training batch replayed from CUDA graphs (`cuda_graphs.py`): a step of a GPU-sized batch
        is otherwise a few thousand operations that the host issues more slowly than the GPU runs them. None where
        that does not apply (CPU, evaluation, states or word embeddings, graphs turned off, a batch large enough to
        keep the GPU busy without them) or when this shape is seen for the first time."""
        elmo = self.elmo
        if not (
            self.training
            and isinstance(input_ids, torch.Tensor)
            and input_ids.is_cuda
            and elmo.encoder.use_cuda_graphs
            and not self.config.input_word_dim
            and input_ids.shape[0] * input_ids.shape[1] <= self._MAX_CAPTURED_POSITIONS
            and not torch.cuda.is_current_stream_capturing()
        ):
            return None
        mask = elmo._check_inputs(input_ids, attention_mask, None)
        autocast = torch.is_autocast_enabled("cuda")
        params = [p for p in self.parameters() if p.requires_grad]
        key = (
            tuple(input_ids.shape), input_ids.dtype, labels.dtype, input_ids.device, autocast,
            torch.get_autocast_dtype("cuda"), tuple(p.data_ptr() for p in params), self.dropout.p,
            elmo.encoder.dropout.p, torch.backends.cuda.matmul.allow_tf32,
        )  # fmt: skip
        def capture():
            # The autocast cache would hand the graph casts of the weights made before it, never updated.
            with torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), enabled=autocast, cache_enabled=False):
                return CapturedFunction(self._training_step_sums, (input_ids, mask, labels), params)

        captured = self._captured_steps.get_or_capture(key, capture)
        if captured is None:
            return None
        if captured.busy:
            return None
        return captured.replay(input_ids, mask, labels)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        elmo_hidden_states: torch.Tensor | None = None,
        return_dict: bool | None = None,
    ) -> TokenClassifierOutput:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(B, T, 50)`): character ids from `ElmoTokenizer`, with `<S>`/`</S>`.
            attention_mask (`torch.Tensor` of shape `(B, T)`, *optional*): 1 at real positions (right padding).
            labels (`torch.LongTensor` of shape `(B, T)`, *optional*): class id of the word at each position, -100 at
                `<S>`, `</S>`, padding (and words to ignore).
            elmo_hidden_states (`torch.Tensor` of shape `(B, T, num_layers + 1, 2P)`, *optional*): precomputed biLM
                layers (see `hf_elmo.data_elmo.ElmoLayerCache`); the biLM is not run when given.

        Returns:
            `TokenClassifierOutput` with `logits` `(B, T, num_labels)` and, with labels, the mean cross-entropy over
            the labelled positions (plus the ScalarMix L2 penalty when `config.scalar_mix_l2 > 0`).
        """
        features, mask = self._task_features(input_ids, attention_mask, elmo_hidden_states)
        logits = F.pad(self.classifier(features) * mask[:, 2:, None], (0, 0, 1, 1))
        loss = None
        if labels is not None:
            self._check_labels(labels, mask)
            loss = self._add_l2_penalty(F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100))
        return TokenClassifierOutput(loss=loss, logits=logits)


__all__ += [
    "ElmoForSequenceClassification",
    "ElmoForTokenClassification",
    "ElmoTaskPreTrainedModel",
    "ScalarMix",
]
