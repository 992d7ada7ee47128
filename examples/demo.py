"""Train a small ELMo biLM on the bundled Shakespeare for a few minutes on CPU, then use it.

    python examples/demo.py [--steps 4000] [--output-dir outputs/demo]

1. Splits data/tinyshakespeare/input.txt: the first 95% of the lines to train on, the last 5% held out.
2. Trains the `tiny` preset as an ElmoForBiLM with the transformers Trainer (`hf_elmo.commands.train`: Adagrad as in the
   original, sampled softmax) for `--steps` steps from a fixed seed, so that its numbers do not depend on the
   machine's speed, and saves it (safetensors, tokenizer with its word vocabulary).
3. Reloads the folder with AutoModel / AutoModelForPreTraining / AutoTokenizer.
4. Prints the held-out forward and backward perplexity next to a unigram model of the training text.
5. Shows that one word gets different vectors in different contexts.
"""

import argparse
import shutil
import time
from pathlib import Path

import torch
from transformers import AutoModel, AutoModelForPreTraining, AutoTokenizer

import hf_elmo  # noqa: F401  (registers ELMo with the Auto classes)
from hf_elmo.commands.train import train_bilm
from hf_elmo.training.perplexity import compute_perplexity, unigram_perplexity

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "data/tinyshakespeare/input.txt"

# "will" as a modal verb and as a noun.
CONTEXTS = [
    "I will not go with thee.",
    "What will you do, my lord?",
    "It is the king's will.",
    "Thy will be done.",
]


def split_corpus(folder: Path) -> tuple[Path, Path]:
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    cut = int(0.95 * len(lines))
    train, held_out = folder / "train.txt", folder / "held_out.txt"
    train.write_text("\n".join(lines[:cut]) + "\n", encoding="utf-8")
    held_out.write_text("\n".join(lines[cut:]) + "\n", encoding="utf-8")
    return train, held_out


def show_contexts(model_dir: Path):
    model = AutoModel.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    batch = tokenizer(CONTEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        layers = model(**batch, output_hidden_states=True).hidden_states
    positions = [1 + tokenizer.split_words(text).index("will") for text in CONTEXTS]  # +1 for <S>
    print("\ncosine similarity of 'will' between contexts, per layer:")
    for k, text in enumerate(CONTEXTS):
        print(f"  [{k}] {text}")
    for layer, states in enumerate(layers):
        vectors = torch.nn.functional.normalize(torch.stack([states[k, p] for k, p in enumerate(positions)]), dim=-1)
        similarity = vectors @ vectors.T
        pairs = "  ".join(f"{i}-{j}: {similarity[i, j]:.3f}" for i in range(4) for j in range(i + 1, 4))
        note = "  (character CNN: the same vector everywhere)" if layer == 0 else ""
        print(f"  layer {layer}: {pairs}{note}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000, help="training steps (batches of 32 windows)")
    parser.add_argument("--output-dir", default=str(ROOT / "outputs/demo"))
    args = parser.parse_args()
    # The LSTM runs one small time step after another. For a model this size a second thread gains little,
    # and when other processes share the cores it waits for them at every step (measured 25x slower).
    torch.set_num_threads(1)

    output = Path(args.output_dir)
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    train_file, held_out_file = split_corpus(output)
    model_dir = output / "elmo-shakespeare"

    start = time.monotonic()
    train_bilm(
        output_dir=model_dir,
        train_files=[train_file],
        config="tiny",
        min_count=2,
        per_device_train_batch_size=32,
        num_softmax_samples=1024,
        max_steps=args.steps,
        logging_steps=250,
        save_steps=args.steps,  # one checkpoint, at the end
        data_cache_dir=str(output / "data-cache"),
    )
    print(f"\ntrained {args.steps:,} steps and saved to {model_dir} in {(time.monotonic() - start) / 60:.1f} minutes")

    bilm = AutoModelForPreTraining.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    print(
        f"reloaded: {type(bilm).__name__} ({sum(p.numel() for p in bilm.parameters()):,} parameters, "
        f"{len(tokenizer.word_vocabulary):,} words), files: {', '.join(sorted(p.name for p in model_dir.glob('*.*')))}"
    )
    result = compute_perplexity(bilm, tokenizer, [held_out_file], split="pretokenizer")
    unigram = unigram_perplexity(tokenizer, [train_file], [held_out_file], split="pretokenizer")
    print(f"\nheld-out perplexity ({result['targets']:,} words per direction, {held_out_file.name}):")
    print(f"  {'':10}{'biLM':>10}{'unigram':>10}")
    for direction in ("forward", "backward"):
        print(f"  {direction:10}{result[direction]:>10.1f}{unigram[direction]:>10.1f}")
    show_contexts(model_dir)


if __name__ == "__main__":
    main()
