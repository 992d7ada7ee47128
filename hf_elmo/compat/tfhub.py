"""TF-Hub ELMo's outputs from any ELMo folder, without TensorFlow.

    elmo = hub.Module("https://tfhub.dev/google/elmo/3", trainable=True)
    vectors = elmo(["the cat is on the mat"])  # `default` alone, as TF-Hub's call without as_dict
    out = elmo(["the cat is on the mat"], signature="default", as_dict=True)
    out = elmo(inputs={"tokens": tokens, "sequence_len": lengths}, signature="tokens", as_dict=True)
->
    from hf_elmo.compat.tfhub import TFHubElmo
    elmo = TFHubElmo("path/to/folder")   # or a Hub id, or an ElmoModel (and its tokenizer)
    ... the calls unchanged; also elmo(tokens=tokens, sequence_len=lengths, as_dict=True)

`out` holds torch tensors under TF-Hub's names, `T` being the longest sentence of the call: `word_emb` `(B, T, P)`
(the character CNN), `lstm_outputs1` and `lstm_outputs2` `(B, T, 2P)` (one per LSTM layer), `elmo` `(B, T, 2P)`
(the learned mix `gamma * sum_k softmax(w)_k * layer_k` of the layers, layer 0 being `[word_emb | word_emb]`; `w`
from zeros and `gamma` from 1 are this module's only trainable parameters, as TF-Hub's with `trainable=True`) and
`default` `(B, 2P)` (the mean of `elmo` over each sentence's words). Positions past a sentence's end are zero in
every output, and an empty sentence's `default` is zero. Strings are split at spaces (empty pieces dropped), as
TF-Hub's `default` signature does. Each sentence starts from zeros (or from the folder's warm start state).
"""

import numpy as np
import torch
from torch import nn

from ..io.files import ElmoInputError
from ..modeling_elmo import ElmoModel
from ..scalar_mix import ScalarMix
from ..tokenization_elmo import ElmoTokenizer
from .allennlp import _without_boundaries
from .loading import check_padded_batch, load_elmo


def _words(value, what: str) -> list[str]:
    if isinstance(value, (str, bytes)):
        raise ElmoInputError(f"{what} must be a list of words, got a single {type(value).__name__}")
    words = [word.decode("utf-8", "replace") if isinstance(word, bytes) else word for word in value]
    if not all(isinstance(word, str) for word in words):
        raise ElmoInputError(f"{what} must hold str words")
    return words


class TFHubElmo(nn.Module):
    """TF-Hub ELMo's `default` and `tokens` signatures; see the module docstring."""

    def __init__(self, model, tokenizer: ElmoTokenizer | None = None):
        super().__init__()
        if isinstance(model, ElmoModel):
            if tokenizer is None and model.config.char_vocabulary:
                raise ElmoInputError("this model reads characters through a vocabulary: pass its tokenizer too")
            tokenizer = tokenizer or ElmoTokenizer(max_characters_per_token=model.config.max_characters_per_token)
        else:
            model, tokenizer = load_elmo(model)
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.mix = ScalarMix(model.config.num_layers + 1)

    def train(self, mode: bool = True):
        super().train(mode)
        self.model.eval()
        return self

    def forward(
        self, inputs=None, signature: str | None = None, as_dict: bool | None = None, *, tokens=None, sequence_len=None
    ) -> dict[str, torch.Tensor] | torch.Tensor:
        """TF-Hub's call: `inputs` a list of strings (`signature="default"` or `None`) or `{"tokens": ...,
        "sequence_len": ...}` (`signature="tokens"`), or the keywords `tokens` and `sequence_len`. Returns `default`
        `(B, 2P)`, or with `as_dict=True` every output by name."""
        signature = signature or "default"
        if signature not in ("default", "tokens"):
            raise ElmoInputError(f"signature must be 'default' or 'tokens', got {signature!r}")
        if signature == "default" and isinstance(inputs, dict):
            raise ElmoInputError(
                'the default signature takes a list of strings; inputs={"tokens": ..., "sequence_len": ...} '
                'needs signature="tokens"'
            )
        if signature == "tokens":
            if not isinstance(inputs, dict) or set(inputs) != {"tokens", "sequence_len"}:
                raise ElmoInputError('signature="tokens" takes inputs={"tokens": ..., "sequence_len": ...}')
            tokens, sequence_len, inputs = inputs["tokens"], inputs["sequence_len"], None
        strings = inputs
        if (strings is None) == (tokens is None):
            raise ElmoInputError("give strings (the default signature) or tokens with sequence_len, one of them")
        if strings is not None:
            sentences = [[word for word in text.split(" ") if word] for text in _words(strings, "strings")]
        else:
            if sequence_len is None:
                raise ElmoInputError("tokens need sequence_len, the number of words of each row")
            lengths = np.asarray(torch.as_tensor(sequence_len).cpu()).reshape(-1)
            rows = list(tokens)
            if len(lengths) != len(rows) or not np.issubdtype(lengths.dtype, np.integer):
                raise ElmoInputError(
                    f"sequence_len must hold one int per row of tokens ({len(rows)}), got {lengths.tolist()}"
                )
            sentences = []
            for index, (row, length) in enumerate(zip(rows, lengths.tolist())):
                row = _words(row, f"tokens row {index}")
                if not 0 <= length <= len(row):
                    raise ElmoInputError(
                        f"sequence_len[{index}] = {length} is not in [0, {len(row)}] (the row's length)"
                    )
                sentences.append(row[:length])
        if sentences:
            longest = max(len(words) for words in sentences)
            check_padded_batch("TFHubElmo", len(sentences), longest + 2, self.model.config)
        counts = torch.tensor([len(words) for words in sentences], device=self.model.device)
        batch = self.tokenizer(sentences, is_split_into_words=True, padding=True, return_tensors="pt")
        out = self.model(**batch.to(self.model.device), output_hidden_states=True)
        positions = out.hidden_states[0].shape[1] - 2
        mask = torch.arange(positions, device=counts.device)[None, :] < counts[:, None]
        layers = [_without_boundaries(layer, mask) for layer in out.hidden_states]
        elmo = self.mix(layers)
        outputs = {"word_emb": layers[0][..., : self.model.config.projection_dim]}
        outputs.update({f"lstm_outputs{k}": layer for k, layer in enumerate(layers[1:], start=1)})
        outputs["elmo"] = elmo
        outputs["default"] = elmo.sum(dim=1) / counts.clamp(min=1)[:, None].to(elmo.dtype)
        return outputs if as_dict else outputs["default"]


__all__ = ["TFHubElmo"]
