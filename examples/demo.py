"""Convert the bundled tiny ELMo (AllenNLP's test model) and print contextual embeddings.

    python examples/demo.py [--output-dir outputs/elmo-fixture]

The bundled model has random weights (it is a test fixture), so the similarities show the mechanics, not
linguistic quality.
"""

import argparse
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

import hf_elmo  # noqa: F401  (registers ELMo with the Auto classes)
from hf_elmo.convert_original_elmo import convert

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests/fixtures/allennlp"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default=str(ROOT / "outputs/elmo-fixture"))
    args = parser.parse_args()

    folder = convert(FIXTURE / "options.json", FIXTURE / "lm_weights.hdf5", args.output_dir, force=True)
    print(f"converted {FIXTURE.relative_to(ROOT)} -> {folder}")
    model = AutoModel.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)

    sentences = ["I sat on the bank of the river.", "She went to the bank to deposit money."]
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
    print(f"input_ids {tuple(batch['input_ids'].shape)} -> {len(out.hidden_states)} layers of "
          f"{tuple(out.last_hidden_state.shape)} (batch, words + <S> + </S>, 2 x projection)")
    vectors = []
    for row, text in enumerate(sentences):
        words = tokenizer.split_words(text)
        position = 1 + words.index("bank")  # +1 for <S>
        print(f"\n{text!r} -> {words}")
        for layer, states in enumerate(out.hidden_states):
            print(f"  layer {layer} 'bank': {states[row, position, :4].numpy().round(4)} ...")
        vectors.append([states[row, position] for states in out.hidden_states])
    print("\ncosine similarity of 'bank' across the two sentences, per layer:")
    for layer, (a, b) in enumerate(zip(*vectors)):
        print(f"  layer {layer}: {torch.cosine_similarity(a, b, dim=0).item():.4f}"
              + ("  (character CNN: context-independent)" if layer == 0 else ""))


if __name__ == "__main__":
    main()
