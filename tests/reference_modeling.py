"""The straightforward PyTorch ELMo the fast path of `ElmoModel` is checked against, written for clarity.

It holds the same parameters under the same names as `ElmoModel` (load its `state_dict`), computes the
character CNN over every slot of every word and steps every row through every time step, masking the
state updates. Runs in any dtype and on any device, with autograd. The benchmarks import it for their
`--compare` mode.
"""

import torch
import torch.nn.functional as F
from torch import nn


class ReferenceCharacterEncoder(nn.Module):
    """`(..., C)` character ids -> `(..., P)` token embeddings."""

    def __init__(self, config):
        super().__init__()
        self.char_embedding = nn.Module()
        self.char_embedding.weight = nn.Parameter(torch.empty(config.n_characters - 1, config.char_embedding_dim))
        self.convolutions = nn.ModuleList(
            nn.Conv1d(config.char_embedding_dim, num, kernel_size=width) for width, num in config.filters
        )
        self.highways = nn.ModuleList(
            nn.Linear(config.num_filters, 2 * config.num_filters) for _ in range(config.n_highway)
        )
        self.word_embedding = (
            nn.Embedding(config.input_word_vocab_size, config.input_word_dim) if config.input_word_dim else None
        )
        self.projection = nn.Linear(config.input_word_dim + config.num_filters, config.projection_dim)
        self.activation = torch.tanh if config.activation == "tanh" else F.relu

    def forward(self, char_ids: torch.LongTensor, word_ids: torch.LongTensor | None = None) -> torch.Tensor:
        batch_shape, num_chars = char_ids.shape[:-1], char_ids.shape[-1]
        table = F.pad(self.char_embedding.weight, (0, 0, 1, 0))  # id 0 (no character) embeds to zeros
        chars = F.embedding(char_ids.reshape(-1, num_chars), table).transpose(1, 2)  # (N, e, C)
        features = torch.cat([self.activation(conv(chars).amax(dim=-1)) for conv in self.convolutions], dim=-1)
        for highway in self.highways:
            transformed, gate = highway(features).chunk(2, dim=-1)
            gate = torch.sigmoid(gate)
            features = gate * features + (1 - gate) * F.relu(transformed)
        if self.word_embedding is not None:  # ELMoForManyLangs: [word | characters]
            features = torch.cat([self.word_embedding(word_ids.reshape(-1)), features], dim=-1)
        return self.projection(features).reshape(*batch_shape, -1)


class ReferenceLstmLayer(nn.Module):
    """One direction of one LSTM layer with a clipped cell and a projected, clipped state."""

    def __init__(self, config):
        super().__init__()
        self.cell_dim = config.cell_dim
        self.cell_clip = config.cell_clip
        self.proj_clip = config.proj_clip
        self.forget_bias = config.forget_bias
        self.input_linearity = nn.Linear(config.projection_dim, 4 * config.cell_dim, bias=False)
        self.state_linearity = nn.Linear(config.projection_dim, 4 * config.cell_dim, bias=True)
        self.state_projection = nn.Linear(config.cell_dim, config.projection_dim, bias=False)

    def forward(self, inputs, mask, hidden, memory, reverse: bool):
        """`(B, T, P)` inputs, `(B, T)` mask, `(B, P)` and `(B, D)` state -> `(B, T, P)` outputs (0 at padding)
        and the final `(B, P)`, `(B, D)` state."""
        seq_len = inputs.shape[1]
        gate_inputs = self.input_linearity(inputs)
        if self.forget_bias:  # TensorFlow's LSTMCell adds it at run time
            gate_inputs[..., self.cell_dim : 2 * self.cell_dim] += self.forget_bias
        outputs = [None] * seq_len
        for t in range(seq_len - 1, -1, -1) if reverse else range(seq_len):
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


class ReferenceBiLstm(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.use_skip_connections = config.use_skip_connections
        self.dropout = nn.Dropout(config.dropout)
        self.forward_layers = nn.ModuleList(ReferenceLstmLayer(config) for _ in range(config.num_layers))
        self.backward_layers = nn.ModuleList(ReferenceLstmLayer(config) for _ in range(config.num_layers))

    def forward(self, token_embeddings, mask, state):
        hidden, memory = state
        forward_in = backward_in = token_embeddings
        layer_outputs, final_hidden, final_memory = [], [], []
        for index, (forward_layer, backward_layer) in enumerate(zip(self.forward_layers, self.backward_layers)):
            forward_hidden, backward_hidden = hidden[index].chunk(2, dim=-1)
            forward_memory, backward_memory = memory[index].chunk(2, dim=-1)
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


class ReferenceElmo(nn.Module):
    """`ElmoModel`'s computation, straightforwardly. Build with the model's config, then
    `load_state_dict(model.state_dict())`."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.char_encoder = ReferenceCharacterEncoder(config)
        self.encoder = ReferenceBiLstm(config)

    def forward(self, input_ids, attention_mask=None, state=None, input_word_ids=None):
        """`(B, T, C)` ids -> `num_layers + 1` layers `(B, T, 2P)` (0 at padding) and the final state
        `(hidden (L, B, 2P), memory (L, B, 2D))`."""
        config = self.config
        mask = (input_ids > 0).any(dim=-1) if attention_mask is None else attention_mask.bool()
        token_embeddings = self.char_encoder(input_ids.long(), input_word_ids)
        if state is None:
            batch_size = input_ids.shape[0]
            state = (
                token_embeddings.new_zeros(config.num_layers, batch_size, 2 * config.projection_dim),
                token_embeddings.new_zeros(config.num_layers, batch_size, 2 * config.cell_dim),
            )
        layer_outputs, final_state = self.encoder(token_embeddings, mask, state)
        layer0 = torch.cat([token_embeddings, token_embeddings], dim=-1) * mask[..., None]
        return [layer0, *layer_outputs], final_state


def reference_from(model) -> ReferenceElmo:
    """A `ReferenceElmo` holding a copy of `model`'s weights, in its dtype and on its device."""
    reference = ReferenceElmo(model.config)
    reference.load_state_dict(model.state_dict())
    parameter = next(model.parameters())
    return reference.to(device=parameter.device, dtype=parameter.dtype).train(model.training)
