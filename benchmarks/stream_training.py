"""Sentence windows against continuous streams (`hf-elmo train --stream`) at equal wall-clock, each model scored in
every mode: the evidence behind `train`'s default.

    python benchmarks/stream_training.py --minutes 12 --output-dir outputs/stream_vs_windows [--order windows stream]

1. Splits the bundled Shakespeare as `make demo` does (first 95% of the lines to train on, the last 5% held out, raw
   text through the tokenizer's word splitter) and builds one vocabulary for both runs (min count 2).
2. Trains the demo's model (`examples/demo.py`) for `--minutes` of training loop each, one run after the other in
   `--order`, with the same recipe (Adagrad 0.2, batch 32, 1,024 sampled negatives, dropout 0.1, one thread):
   windows of whole sentences (22 positions) and `--stream` (32 rows of pieces of 20 positions, state carried).
3. Scores both on the held-out text: the windows (`perplexity` default), bilm-tf's stream at batch 1 and 16
   (`--stream`), every line from zeros (`--start zero`) and from the warm start state (`--start warm`; the windows
   model gets one estimated from its training text, as `hf-elmo warm-state` does; the stream model has its own).

Prints the steps each run made, its training tokens per second per direction, and the combined perplexities. On a
shared machine run both orders and compare like with like.
"""

import argparse
import json
import time
from pathlib import Path

import torch

import hf_elmo  # noqa: F401
from hf_elmo import ElmoConfig
from hf_elmo.commands.train import train_bilm
from hf_elmo.tokenization_elmo import ElmoTokenizer
from hf_elmo.training.corpus import build_word_vocabulary, iter_sentences
from hf_elmo.training.perplexity import compute_perplexity, load_bilm, sentence_perplexity, stream_perplexity
from hf_elmo.training.warm_state import estimate_warm_state
from hf_elmo.training.windows import pack_sentences
from hf_elmo.word_vocabulary import write_word_vocabulary

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "data/tinyshakespeare/input.txt"
CONFIG = ElmoConfig.from_preset("tiny")  # examples/demo.py's model
WINDOW = {"windows": 22, "stream": 20}  # the longest line has 20 words; bilm-tf's pieces have 20 positions


def prepare(folder: Path) -> tuple[Path, Path, Path]:
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    cut = int(0.95 * len(lines))
    train, held_out, vocab = folder / "train.txt", folder / "held_out.txt", folder / "vocab.txt"
    train.write_text("\n".join(lines[:cut]) + "\n", encoding="utf-8")
    held_out.write_text("\n".join(line for line in lines[cut:] if line.strip()) + "\n", encoding="utf-8")
    write_word_vocabulary(build_word_vocabulary([train], "pretokenizer", ElmoTokenizer(), min_count=2), vocab)
    CONFIG.to_json_file(folder / "config.json")
    return train, held_out, vocab


def train(mode: str, folder: Path, minutes: float, train_file: Path, vocab: Path) -> dict:
    start = time.monotonic()
    metrics = train_bilm(
        output_dir=folder / mode,
        train_files=[train_file],
        vocab=str(vocab),
        config=str(folder / "config.json"),
        split="pretokenizer",
        stream=mode == "stream",
        window=WINDOW[mode],
        per_device_train_batch_size=32,
        num_softmax_samples=1024,
        max_minutes=minutes,
        max_steps=1_000_000,
        logging_steps=100,
        save_steps=1_000_000,
        data_cache_dir=str(folder / "data-cache"),
        disable_tqdm=True,
    )
    runtime, steps = metrics["train_runtime"], metrics["steps"]
    # Targets per step and direction: stream rows are full; a window holds its sentences' words and </S>.
    if mode == "stream":
        targets = steps * 32 * WINDOW["stream"]
    else:
        sentences = list(iter_sentences([train_file], "pretokenizer", ElmoTokenizer()))
        windows = sum(1 for _ in pack_sentences(sentences, WINDOW["windows"]))
        targets = steps * 32 * sum(len(s) + 1 for s in sentences) / windows
    return {
        "steps": steps,
        "runtime": runtime,
        "tokens_per_second": targets / runtime,
        "wall": time.monotonic() - start,
    }


def score(model_dir: Path, held_out: Path, train_file: Path) -> dict:
    model, tokenizer = load_bilm(model_dir)
    files = [held_out]
    results = {
        "windows": compute_perplexity(model, tokenizer, files, window=22, split="pretokenizer"),
        "stream B=1": stream_perplexity(model, tokenizer, files, batch_size=1, split="pretokenizer"),
        "stream B=16": stream_perplexity(model, tokenizer, files, batch_size=16, split="pretokenizer"),
        "zero": sentence_perplexity(model, tokenizer, files, "zero", split="pretokenizer"),
    }
    if model.elmo.warm_state is None:
        sentences = list(iter_sentences([train_file], "pretokenizer", tokenizer))[:2000]
        model.elmo.set_warm_state(estimate_warm_state(model.elmo, sentences, tokenizer))
    results["warm"] = sentence_perplexity(model, tokenizer, files, "warm", split="pretokenizer")
    return {mode: result["geometric_mean"] for mode, result in results.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=12.0, help="training loop time of each run")
    parser.add_argument("--output-dir", default=str(ROOT / "outputs/stream_vs_windows"))
    parser.add_argument("--order", nargs=2, default=["windows", "stream"], choices=["windows", "stream"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = Path(args.output_dir)
    folder.mkdir(parents=True, exist_ok=False)
    train_file, held_out, vocab = prepare(folder)
    runs = {mode: train(mode, folder, args.minutes, train_file, vocab) for mode in args.order}
    scores = {mode: score(folder / mode, held_out, train_file) for mode in args.order}
    modes = list(next(iter(scores.values())))
    print(
        f"\n{args.minutes:g} minutes of training each, in the order {', '.join(args.order)}; held-out "
        f"{held_out.name}: combined perplexity (geometric mean of forward and backward)\n"
    )
    print("| trained on | steps | tokens/s per direction | " + " | ".join(modes) + " |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in modes) + " |")
    for mode in args.order:
        run = runs[mode]
        cells = " | ".join(f"{scores[mode][m]:.2f}" for m in modes)
        print(f"| {mode} | {run['steps']:,} | {run['tokens_per_second']:,.0f} | {cells} |")
    (folder / "results.json").write_text(json.dumps({"runs": runs, "scores": scores}, indent=2) + "\n")


if __name__ == "__main__":
    main()
