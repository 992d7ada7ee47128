"""Makes `tests/fixtures/seqvec/allennlp_outputs.npz`: what AllenNLP 0.9's own `ElmoEmbedder` (the class SeqVec and
bio_embeddings call) computes on a SeqVec-shaped model with random weights (`tests/seqvec_shaped.py`).

AllenNLP 0.9 no longer installs on a current Python, so its model files are imported from a checkout of its
v0.9.0 tag and run unmodified: `allennlp/modules/{elmo,elmo_lstm,lstm_cell_with_projection,highway,encoder_base,
scalar_mix}.py`, `allennlp/nn/util.py`, `allennlp/data/token_indexers/elmo_indexer.py` and
`allennlp/commands/elmo.py`. Only what those files import from the rest of AllenNLP (its configuration, file cache,
dataset and registry machinery, none of which takes part in the computation) is replaced by stand-ins below, and
`batch_to_ids`, which goes through AllenNLP's dataset classes, by the same rows made with its own
`ELMoCharacterMapper` (zero rows for padding, as its indexer pads); `lazy_groups_of` (consecutive groups of a
given size) by `itertools.islice`. `block_orthogonal` (initialisation) is a no-op:
every parameter is then read from `weights.hdf5` by AllenNLP's loaders.

    python conversion/seqvec_reference_outputs.py --their-code ALLENNLP_V0_9_0_CHECKOUT \\
        --output tests/fixtures/seqvec/allennlp_outputs.npz

The calls, on one `ElmoEmbedder` that carries its state from call to call as SeqVec's scripts do, are listed in
`CALLS`; for each output the file keeps the vectors of a few residues (`rows`) and two reductions over all of them
(README next to the fixture).
"""

import argparse
import importlib.util
import itertools
import json
import sys
import time
import types
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from seqvec_shaped import SEED, SEQVEC_OPTIONS, SMALL_OPTIONS, random_protein, write_seqvec_shaped  # noqa: E402

SEQUENCE_SEED = 44
# Per model, the calls in order, (kind, lengths): embed_sentence of one sequence, embed_batch of a list,
# embed_sentences with batch_size 2. SeqVec's own sizes run about 15 ms per residue and layer on a CPU core in
# either implementation, so the long proteins run on the small model of the same structure.
CALLS = {
    "seqvec": [
        ("embed_sentence", [1]),
        ("embed_sentence", [2]),
        ("embed_batch", [40, 7, 90]),
        ("embed_sentence", [50]),
        ("embed_sentences", [30, 3, 12]),
    ],
    "small": [
        ("embed_sentence", [1]),
        ("embed_sentence", [2]),
        ("embed_sentence", [50]),
        ("embed_batch", [120, 7, 333]),
        ("embed_sentence", [1000]),
        ("embed_sentences", [64, 3, 90]),
        ("embed_sentence", [5000]),
        ("embed_batch", [5000, 1, 2500]),
    ],
}
OPTIONS = {"seqvec": SEQVEC_OPTIONS, "small": SMALL_OPTIONS}


def stored_rows(length: int) -> list[int]:
    """The residues whose vectors the fixture keeps: both ends and every eighth of the way."""
    step = max(1, length // 8)
    return sorted({0, 1, length - 2, length - 1, *range(0, length, step)} & set(range(length)))


def sequences_of_calls(calls) -> list[tuple[str, list[str]]]:
    generator = np.random.default_rng(SEQUENCE_SEED)
    return [(kind, [random_protein(length, generator) for length in lengths]) for kind, lengths in calls]


def _module(name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []
    module.__dict__.update(attributes)
    sys.modules[name] = module
    return module


def _load(their_code: Path, name: str) -> types.ModuleType:
    path = their_code / (name.replace(".", "/") + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_their_embedder(their_code: Path):
    """AllenNLP 0.9's `ElmoEmbedder` class, from the checkout's files."""

    class ConfigurationError(Exception):
        pass

    class Registrable:
        @classmethod
        def register(cls, name):
            return lambda registered: registered

    T = TypeVar("T")

    class TokenIndexer(Generic[T], Registrable):
        def __init__(self, *args, **kwargs):
            pass

    class Unused:
        def __init__(self, *args, **kwargs):
            raise NotImplementedError("not part of the computation")

    for package in ("allennlp", "allennlp.modules", "allennlp.nn", "allennlp.data", "allennlp.commands"):
        _module(package)
    _module("allennlp.data.token_indexers")
    _module("overrides", overrides=lambda method: method)
    _module("allennlp.common", Params=dict, Registrable=Registrable)
    _module("allennlp.common.checks", ConfigurationError=ConfigurationError)
    _module("allennlp.common.file_utils", cached_path=str)
    _module(
        "allennlp.common.util",
        lazy_groups_of=lambda iterator, size: iter(lambda: list(itertools.islice(iterator, size)), []),
        pad_sequence_to_length=Unused,
        prepare_global_logging=Unused,
    )
    _module("allennlp.common.tqdm", Tqdm=Unused)
    _module("allennlp.commands.subcommand", Subcommand=object)
    _module("allennlp.nn.initializers", block_orthogonal=lambda tensor, split_sizes, gain=1.0: None)
    _module("allennlp.data.tokenizers")
    _module("allennlp.data.tokenizers.token", Token=Unused)
    _module("allennlp.data.token_indexers.token_indexer", TokenIndexer=TokenIndexer)
    _module("allennlp.data.vocabulary", Vocabulary=Unused)
    _module("allennlp.data.dataset", Batch=Unused)
    _module("allennlp.data.fields", TextField=Unused)
    sys.modules["allennlp.data"].__dict__.update(Token=Unused, Vocabulary=Unused, Instance=Unused)
    for name in (
        "allennlp.nn.util",
        "allennlp.data.token_indexers.elmo_indexer",
        "allennlp.modules.highway",
        "allennlp.modules.scalar_mix",
        "allennlp.modules.encoder_base",
        "allennlp.modules.lstm_cell_with_projection",
        "allennlp.modules.elmo_lstm",
        "allennlp.modules.elmo",
        "allennlp.commands.elmo",
    ):
        _load(their_code, name)
    mapper = sys.modules["allennlp.data.token_indexers.elmo_indexer"].ELMoCharacterMapper()

    def batch_to_ids(batch):
        longest = max(len(sentence) for sentence in batch)
        ids = torch.zeros((len(batch), longest, 50), dtype=torch.long)
        for i, sentence in enumerate(batch):
            for j, word in enumerate(sentence):
                ids[i, j] = torch.tensor(mapper.convert_word_to_char_ids(word))
        return ids

    sys.modules["allennlp.modules.elmo"].batch_to_ids = batch_to_ids
    sys.modules["allennlp.commands.elmo"].batch_to_ids = batch_to_ids
    return sys.modules["allennlp.commands.elmo"].ElmoEmbedder


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--their-code", type=Path, required=True, help="checkout of allenai/allennlp at v0.9.0")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--model-dir", type=Path, required=True, help="where the models are written")
    args = parser.parse_args()
    torch.set_num_threads(1)
    embedder_class = load_their_embedder(args.their_code.resolve())
    arrays = {}
    for model, calls in CALLS.items():
        options, weights = write_seqvec_shaped(args.model_dir / model, OPTIONS[model], SEED)
        embedder = embedder_class(str(options), str(weights), cuda_device=-1)
        calls = sequences_of_calls(calls)
        for c, (kind, sequences) in enumerate(calls):
            start = time.perf_counter()
            with torch.no_grad():
                if kind == "embed_sentence":
                    outputs = [embedder.embed_sentence(list(sequences[0]))]
                elif kind == "embed_batch":
                    outputs = embedder.embed_batch([list(s) for s in sequences])
                else:
                    outputs = list(embedder.embed_sentences((list(s) for s in sequences), batch_size=2))
            lengths = [len(s) for s in sequences]
            print(f"{model} call {c} {kind} {lengths}: {time.perf_counter() - start:.1f} s", flush=True)
            for k, (sequence, output) in enumerate(zip(sequences, outputs)):
                key = f"{model}/call_{c}/sequence_{k}"
                arrays[f"{key}/rows"] = output[:, stored_rows(len(sequence))].astype(np.float32)
                per_residue = output.sum(axis=0)  # SeqVec's per-residue vectors
                arrays[f"{key}/per_protein"] = per_residue.mean(axis=0).astype(np.float32)
                arrays[f"{key}/layer_means"] = output.mean(axis=1).astype(np.float32)
        arrays[f"{model}/calls"] = np.array(json.dumps(calls))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.output, **arrays)


if __name__ == "__main__":
    main()
