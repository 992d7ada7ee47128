"""ELMoForManyLangs' `Embedder` on hf-elmo's model: change the import, keep the code.

    from elmoformanylangs import Embedder   ->  from hf_elmo.compat.elmoformanylangs import Embedder

    e = Embedder("zht.model")   # their model folder, read directly; or a converted folder, or a Hub id
    vectors = e.sents2elmo([["今", "天"], ["天", "氣"]], output_layer=-1)

`sents2elmo(sents, output_layer=-1)` returns, as theirs, one float32 numpy array per sentence: `(n_words, 2P)` for
`output_layer` -1 (the unweighted mean of the layers), 0 (the token embedding `[x | x]`), 1 or 2 (the LSTM
layers), and `(num_layers + 1, n_words, 2P)` for -2 (all). The numbers are the converted model's
(`hf-elmo convert --format elmoformanylangs`).

Differences: every sentence starts from zeros (theirs carry the LSTM state from batch to batch and between calls,
in a random batch order, so their numbers change from call to call; theirs match these for a fresh `Embedder` given
all sentences in one batch); an empty sentence gives an empty array (theirs fail with `output_layer=-1`).
"""

from pathlib import Path

import numpy as np
import torch

from ..convert.from_elmoformanylangs import load_elmoformanylangs
from ..features.embed import Embedder as _LayerEmbedder
from ..features.embed import LayerSelector
from ..io.files import ElmoInputError
from .loading import load_elmo


class Embedder:
    """ELMoForManyLangs' `Embedder(model_dir, batch_size=64)`: `model_dir` is their model folder (`config.json`,
    `char.dic`, `word.dic`, `token_embedder.pkl`, `encoder.pkl`), an hf-elmo folder or a Hub id. Runs on the GPU
    when there is one, as theirs."""

    def __init__(self, model_dir, batch_size: int = 64):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ElmoInputError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.model_dir = model_dir
        self.batch_size = batch_size
        if (Path(model_dir) / "token_embedder.pkl").is_file():
            model, tokenizer = load_elmoformanylangs(model_dir)
        else:
            model, tokenizer = load_elmo(model_dir)
        self.model = model.to("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = tokenizer

    def sents2elmo(self, sents, output_layer: int = -1) -> list[np.ndarray]:
        """One array per sentence (a list of words), in input order; see the module docstring for `output_layer`."""
        layers = self.model.config.num_layers + 1
        if (
            isinstance(output_layer, bool)
            or not isinstance(output_layer, (int, np.integer))
            or not (-2 <= output_layer < layers)
        ):
            raise ElmoInputError(
                f"output_layer must be -1 (average), -2 (all layers) or a layer in [0, {layers - 1}], got "
                f"{output_layer!r}"
            )
        if isinstance(sents, (str, bytes)):
            raise ElmoInputError("sents2elmo expects a list of sentences, each a list of words; got a str")
        sentences = []
        for index, sentence in enumerate(sents):
            if isinstance(sentence, (str, bytes)) or not all(isinstance(word, str) for word in sentence):
                raise ElmoInputError(f"sents2elmo: sentence {index} must be a list of str (its words)")
            sentences.append(list(sentence))
        # Arrays in the model's dtype: float32 as theirs, unless the model was moved to another.
        embedder = _LayerEmbedder(self.model, self.tokenizer, LayerSelector("all", layers - 1), self.model.dtype)
        results = []
        for start in range(0, len(sentences), self.batch_size):
            batch = sentences[start : start + self.batch_size]
            counts = [len(words) for words in batch]
            vectors = embedder(batch)  # (layers, all words of the batch, 2P)
            for data in np.split(vectors, np.cumsum(counts)[:-1], axis=1):
                if output_layer == -1:
                    results.append(data.mean(axis=0, dtype=data.dtype))
                elif output_layer == -2:
                    results.append(data)
                else:
                    results.append(data[output_layer])
        return results


__all__ = ["Embedder"]
