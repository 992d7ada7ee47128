"""Builds the small ELMoForManyLangs model of `tests/fixtures/elmoformanylangs/` and records what HIT-SCIR's own
`Embedder` computes on it.

    python conversion/elmoformanylangs_reference_outputs.py --their-code CHECKOUT --output-dir FOLDER

`CHECKOUT` is a checkout of HIT-SCIR/ELMoForManyLangs; its package `elmoformanylangs` is imported from there and
run as it is. Run it with their dependencies (torch, numpy, h5py, overrides < 4: the later `overrides` refuse their
`Highway.forward` annotation), not with this package, which it does not import. Writes to `FOLDER`:

- `zz.model/`: a model folder in their layout: the training arguments `config.json` (its `config_path` an absolute
  path elsewhere, so that loading takes the basename fallback), the model configuration, `char.dic` with a U+3000
  entry written as a line that strips down to its id, `word.dic`, and `token_embedder.pkl` / `encoder.pkl` saved in
  torch 0.4's legacy format with storages tagged `cuda:0`, as the released files are; random weights;
- `sentences.json`: the input sentences (word lists);
- `sents2elmo.npz`: `output_layer_{L}_sentence_{k}`, their `sents2elmo(sentences, output_layer=L)` for L in -1
  (mean of the layers), 0, 1, 2, from a fresh `Embedder` each (their encoder carries its state from call to call),
  all sentences in one batch; -1 without the empty sentence, on which their average divides by zero;
  `second_call_sentence_{k}`: `output_layer=-2` (all layers) of a second call on the `Embedder` that made the
  `output_layer=2` outputs, which starts where the first call left each row.
"""

import argparse
import collections
import json
import random
import sys
from pathlib import Path

import numpy as np
import torch
import torch.serialization

# Training words in order of first appearance; the corpus holds the literal <bos>/<eos>, so '<', 'b', 'o', 's', '>'
# come first, as in their trainer.
CORPUS_WORDS = ["<bos>", "the", "cat", "naïve", "Ελλάδα", "мир", "日本語", "😀", "𝐀𝐁", "ab" * 30, "<eos>"]
IDEOGRAPHIC_SPACE = "\u3000"
WORDS = ["the", "cat", "naïve", "日本語", ("ab" * 30)[:48]]  # the 48-character prefix, as their trainer counts it
CONFIG = {
    # clips lower than the released 3 so that these small random weights reach them
    "encoder": {"name": "elmo", "projection_dim": 8, "cell_clip": 1.0, "proj_clip": 0.5, "dim": 16, "n_layers": 2},
    "token_embedder": {
        "name": "cnn",
        "activation": "relu",
        "filters": [[1, 2], [2, 2], [3, 4]],
        "n_highway": 2,
        "word_dim": 5,
        "char_dim": 4,
        "max_characters_per_token": 50,
    },
    "classifier": {"name": "sampled_softmax", "n_samples": 8192},
    "dropout": 0.1,
}
CONFIG_NAME = "cnn_4_5_8_16_sample.json"
SENTENCES = [
    ["the", "cat", "sat"],  # "sat" is not in word.dic, its 's' and 'a' are in char.dic, 't' too
    ["naïve", "nai\u0301ve", "Ελλάδα", "日本語", "😀", "𝐀𝐁"],  # NFD: U+0301 is not in char.dic
    ["ab" * 30, "<bos>", "<pad>", "a" + IDEOGRAPHIC_SPACE + "b", "zzz"],
    [],
    ["<eos>", "мир", "<oov>", "<bow>", "ab" * 24, "ab" * 24 + "a"],  # 48 characters kept, 49 cut to 48
]
OUTPUT_LAYERS = (-1, 0, 1, 2)


def characters():
    seen = dict.fromkeys(c for word in CORPUS_WORDS for c in word)
    return [*seen, IDEOGRAPHIC_SPACE, "<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>"]


def save_legacy_cuda(state, path):
    """torch.save in torch 0.4's non-zip format with storages tagged cuda:0, as the released files are."""
    original = torch.serialization.location_tag
    torch.serialization.location_tag = lambda storage: "cuda:0"
    try:
        torch.save(state, path, _use_new_zipfile_serialization=False)
    finally:
        torch.serialization.location_tag = original


def build_model_folder(folder, seed=0):
    folder.mkdir(parents=True)
    chars = characters()
    # The U+3000 line strips down to its id: their loader makes it the entry U+3000 again.
    (folder / "char.dic").write_text("".join(f"{c}\t{i}\n" for i, c in enumerate(chars)), encoding="utf-8")
    words = ["<oov>", "<bos>", "<eos>", "<pad>", *WORDS]
    (folder / "word.dic").write_text("".join(f"{w}\t{i}\n" for i, w in enumerate(words)), encoding="utf-8")
    (folder / CONFIG_NAME).write_text(json.dumps(CONFIG))
    training = {
        "seed": 1,
        "gpu": 0,
        "train_path": "/data/elmo_stand_in/train.txt",
        "valid_path": None,
        "test_path": None,
        "config_path": f"/data/elmo_stand_in/{CONFIG_NAME}",
        "word_embedding": None,
    }
    (folder / "config.json").write_text(json.dumps(training))

    generator = torch.Generator().manual_seed(seed)
    randn = lambda *shape, scale=1.0: torch.randn(*shape, generator=generator) * scale  # noqa: E731
    tok, enc = CONFIG["token_embedder"], CONFIG["encoder"]
    e, P, D, W = tok["char_dim"], enc["projection_dim"], enc["dim"], tok["word_dim"]
    F = sum(n for _, n in tok["filters"])
    unit_rows = lambda rows, dim: torch.nn.functional.normalize(randn(rows, dim), dim=1)  # noqa: E731
    embedder = collections.OrderedDict()
    embedder["word_emb_layer.embedding.weight"] = unit_rows(len(words), W)
    embedder["char_emb_layer.embedding.weight"] = unit_rows(len(chars), e)  # the <pad> row is not zero
    for k, (width, num) in enumerate(tok["filters"]):
        embedder[f"convolutions.{k}.weight"] = randn(num, e, width, scale=(e * width) ** -0.5)
        embedder[f"convolutions.{k}.bias"] = randn(num, scale=0.1)
    for j in range(tok["n_highway"]):
        embedder[f"highways._layers.{j}.weight"] = randn(2 * F, F, scale=F**-0.5)
        embedder[f"highways._layers.{j}.bias"] = randn(2 * F, scale=0.1) + torch.cat(
            [torch.zeros(F), torch.full((F,), 0.5)]
        )
    embedder["projection.weight"] = randn(P, W + F, scale=2 * (W + F) ** -0.5)
    embedder["projection.bias"] = randn(P, scale=0.1)
    encoder = collections.OrderedDict()
    for layer in range(enc["n_layers"]):
        for direction in ("forward", "backward"):
            prefix = f"{direction}_layer_{layer}"
            encoder[f"{prefix}.input_linearity.weight"] = randn(4 * D, P, scale=2 * P**-0.5)
            encoder[f"{prefix}.state_linearity.weight"] = randn(4 * D, P, scale=2 * P**-0.5)
            encoder[f"{prefix}.state_linearity.bias"] = randn(4 * D, scale=0.1) + torch.cat(
                [torch.zeros(D), torch.full((D,), 1.5), torch.zeros(2 * D)]
            )
            encoder[f"{prefix}.state_projection.weight"] = randn(P, D, scale=2 * D**-0.5)
    save_legacy_cuda(embedder, folder / "token_embedder.pkl")
    save_legacy_cuda(encoder, folder / "encoder.pkl")
    return folder


def their_outputs(embedder_class, model_dir):
    """Their `sents2elmo` outputs, named as in `sents2elmo.npz`."""
    outputs = {}
    for layer in OUTPUT_LAYERS:
        kept = [k for k, words in enumerate(SENTENCES) if words or layer != -1]
        embedder = embedder_class(str(model_dir), batch_size=len(SENTENCES))
        for k, vectors in zip(kept, embedder.sents2elmo([SENTENCES[k] for k in kept], output_layer=layer)):
            outputs[f"output_layer_{layer}_sentence_{k}"] = vectors
        if layer == 2:
            for k, vectors in enumerate(embedder.sents2elmo(SENTENCES, output_layer=-2)):
                outputs[f"second_call_sentence_{k}"] = vectors
    return outputs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--their-code", required=True, type=Path, help="a checkout of HIT-SCIR/ELMoForManyLangs")
    parser.add_argument("--output-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    if not (args.their_code / "elmoformanylangs" / "elmo.py").is_file():
        parser.error(f"--their-code: {args.their_code} holds no elmoformanylangs/elmo.py")
    written = [args.output_dir / name for name in ("zz.model", "sentences.json", "sents2elmo.npz")]
    if any(path.exists() for path in written):
        parser.error(f"--output-dir: {args.output_dir} already holds {[p.name for p in written if p.exists()]}")
    if torch.cuda.is_available():
        parser.error("their Embedder moves to a GPU when it sees one: run with CUDA_VISIBLE_DEVICES=''")
    sys.path.insert(0, str(args.their_code.resolve()))
    from elmoformanylangs import Embedder

    random.seed(0)  # their batcher shuffles batches with the global generator (one batch here: no effect)
    model_dir = build_model_folder(args.output_dir / "zz.model")
    (args.output_dir / "sentences.json").write_text(json.dumps(SENTENCES, ensure_ascii=False, indent=1) + "\n")
    outputs = their_outputs(Embedder, model_dir)
    assert all(value.dtype == np.float32 for value in outputs.values())
    np.savez(args.output_dir / "sents2elmo.npz", **outputs)


if __name__ == "__main__":
    main()
