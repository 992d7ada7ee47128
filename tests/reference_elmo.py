"""A float64 NumPy ELMo written for clarity, one sentence at a time: the independent truth the tests
compare the PyTorch model with. It reads the model's state dict, so it shares no code with it."""

import numpy as np


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def char_cnn(weights: dict, config, char_ids: np.ndarray) -> np.ndarray:
    """`(n_words, 50)` ids -> `(n_words, P)` token embeddings."""
    table = np.concatenate([np.zeros((1, config.char_embedding_dim)), weights["char_encoder.char_embedding.weight"]])
    relu = lambda x: np.maximum(x, 0.0)  # noqa: E731
    activation = np.tanh if config.activation == "tanh" else relu
    outputs = []
    for word in char_ids:
        chars = table[word]  # (50, e)
        features = []
        for i, (width, _count) in enumerate(config.filters):
            kernel = weights[f"char_encoder.convolutions.{i}.weight"]  # (num, e, width)
            bias = weights[f"char_encoder.convolutions.{i}.bias"]
            windows = np.stack([chars[s : s + width] for s in range(len(word) - width + 1)])  # (S, width, e)
            conv = np.einsum("swe,new->sn", windows, kernel) + bias
            features.append(activation(conv.max(axis=0)))
        x = np.concatenate(features)
        for k in range(config.n_highway):
            weight, bias = weights[f"char_encoder.highways.{k}.weight"], weights[f"char_encoder.highways.{k}.bias"]
            both = weight @ x + bias
            transformed, gate = both[: len(x)], sigmoid(both[len(x) :])
            x = gate * x + (1 - gate) * relu(transformed)
        outputs.append(weights["char_encoder.projection.weight"] @ x + weights["char_encoder.projection.bias"])
    return np.stack(outputs)


def lstm_direction(weights: dict, config, prefix: str, inputs: np.ndarray, h, c, reverse: bool):
    """`(n, P)` inputs of one sentence -> `(n, P)` outputs and the final `(h, c)`."""
    w_x = weights[f"{prefix}.input_linearity.weight"]
    w_h = weights[f"{prefix}.state_linearity.weight"]
    b = weights[f"{prefix}.state_linearity.bias"]
    w_p = weights[f"{prefix}.state_projection.weight"]
    D = config.cell_dim
    outputs = np.zeros((len(inputs), config.projection_dim))
    for t in reversed(range(len(inputs))) if reverse else range(len(inputs)):
        z = w_x @ inputs[t] + w_h @ h + b
        z[D : 2 * D] += config.forget_bias  # TensorFlow's LSTMCell adds it at run time (0 for other models)
        i, f, g, o = sigmoid(z[:D]), sigmoid(z[D : 2 * D]), np.tanh(z[2 * D : 3 * D]), sigmoid(z[3 * D :])
        c = i * g + f * c
        if config.cell_clip is not None:
            c = np.clip(c, -config.cell_clip, config.cell_clip)
        h = w_p @ (o * np.tanh(c))
        if config.proj_clip is not None:
            h = np.clip(h, -config.proj_clip, config.proj_clip)
        outputs[t] = h
    return outputs, h, c


def bilm(weights: dict, config, char_ids: np.ndarray, state=None):
    """One sentence `(n, 50)` (boundaries included, no padding) -> `num_layers + 1` layers `(n, 2P)` and the
    final state `(h (L, 2P), c (L, 2D))`."""
    weights = {k: v.detach().double().numpy() for k, v in weights.items()}
    P, D, L = config.projection_dim, config.cell_dim, config.num_layers
    if state is None:
        state = (np.zeros((L, 2 * P)), np.zeros((L, 2 * D)))
    x = char_cnn(weights, config, char_ids)
    layers = [np.concatenate([x, x], axis=-1)]
    forward_in = backward_in = x
    final_h, final_c = [], []
    for layer in range(L):
        h, c = state[0][layer], state[1][layer]
        fwd, fh, fc = lstm_direction(
            weights, config, f"encoder.forward_layers.{layer}", forward_in, h[:P], c[:D], False
        )
        bwd, bh, bc = lstm_direction(
            weights, config, f"encoder.backward_layers.{layer}", backward_in, h[P:], c[D:], True
        )
        if config.use_skip_connections and layer > 0:
            fwd, bwd = fwd + forward_in, bwd + backward_in
        forward_in, backward_in = fwd, bwd
        layers.append(np.concatenate([fwd, bwd], axis=-1))
        final_h.append(np.concatenate([fh, bh]))
        final_c.append(np.concatenate([fc, bc]))
    return layers, (np.stack(final_h), np.stack(final_c))
