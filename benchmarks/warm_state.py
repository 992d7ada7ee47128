"""How the warm start state depends on the number of sentences and on the text it is estimated from.

    python benchmarks/warm_state.py [--sentences 10 100 500 2000]

On the biLM bilm-tf trained (`tests/fixtures/bilm-tf-checkpoint`, converted from its TensorFlow checkpoint):
held-out combined perplexity of every line from the zero state, from warm states estimated (`hf-elmo warm-state`)
from the first N sentences of its training text (in-domain) and of the bundled Shakespeare (other text), and
bilm-tf's own stream evaluation at batch 1 and 16 (`perplexity --stream`) for comparison. Prints a markdown table.
"""

import argparse
import tempfile
from pathlib import Path

import torch

import hf_elmo  # noqa: F401
from hf_elmo.convert.from_bilm_tf_checkpoint import convert_bilm_tf_checkpoint
from hf_elmo.training.perplexity import load_bilm, sentence_perplexity, stream_perplexity
from hf_elmo.training.warm_state import estimate_warm_state, read_sentences

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests/fixtures/bilm-tf-checkpoint"
TEXTS = {
    "in-domain (its training text)": FIXTURE / "train.txt",
    "other (Shakespeare)": ROOT / "data/tinyshakespeare/input.txt",
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, nargs="+", default=[10, 100, 500, 2000])
    args = parser.parse_args()
    torch.set_num_threads(1)
    held_out = [FIXTURE / "heldout.txt"]
    with tempfile.TemporaryDirectory() as folder:
        convert_bilm_tf_checkpoint(FIXTURE / "tf_checkpoint", Path(folder) / "bilm", FIXTURE / "vocab.txt")
        model, tokenizer = load_bilm(Path(folder) / "bilm")
    zero = sentence_perplexity(model, tokenizer, held_out, "zero")["geometric_mean"]
    streams = {b: stream_perplexity(model, tokenizer, held_out, batch_size=b)["geometric_mean"] for b in (1, 16)}
    print(f"every line from zeros: {zero:.3f}; bilm-tf's stream: {streams[1]:.3f} (batch 1), {streams[16]:.3f} (16)\n")
    print("| sentences N | " + " | ".join(TEXTS) + " |")
    print("| ---: | " + " | ".join("---:" for _ in TEXTS) + " |")
    for count in args.sentences:
        cells = []
        for path in TEXTS.values():
            model.elmo.set_warm_state(estimate_warm_state(model.elmo, read_sentences([path], count), tokenizer))
            warm = sentence_perplexity(model, tokenizer, held_out, "warm")["geometric_mean"]
            cells.append(f"{warm:.3f} ({100 * (warm / streams[1] - 1):+.2f}%)")
        print(f"| {count:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
