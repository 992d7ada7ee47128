"""Universal POS tagging on UD English EWT with ElmoForTokenClassification and Trainer: the paper's ablations.

    python examples/pos_tagging.py --model DIR [--train-sentences N] [--eval-sentences N] [--epochs 5] [--threads 1]

DIR is any ELMo folder: a converted original model (`hf-elmo convert`) or a trained biLM. The bundled data are the
dev and test splits of EWT: the tagger trains on dev and is evaluated on test (UPOS accuracy over all words). The
biLM is frozen, so its layers are computed once (`ElmoLayerCache`) and shared by every ablation:

  * ELMo at the BiLSTM's input, ScalarMix over all layers with learned weights (the default);
  * the same with equal, frozen weights;
  * the top layer only; layer 0 (the character CNN) only;
  * ELMo at the BiLSTM's input and output, each with its own learned ScalarMix.

Prints a markdown table; `--predictions FILE` also writes each ablation's predicted tags, one list per sentence, and
`--save-taggers` each ablation's trained tagger (with the biLM) into its folder under `--output-dir`.
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from transformers import AutoModelForTokenClassification, AutoTokenizer, Trainer, TrainingArguments, set_seed

import hf_elmo  # noqa: F401  (registers ELMo with the Auto classes)
from hf_elmo import ElmoModel
from hf_elmo.features.task_data import DataCollatorForElmo, ElmoLayerCache, tokenize_and_align_labels

DATA = Path(__file__).resolve().parent / "data/ud_english_ewt"


def read_conllu(path: Path, limit: int | None = None) -> tuple[list[list[str]], list[list[str]]]:
    """Words and UPOS tags of each sentence (multi-word token ranges and empty nodes skipped)."""
    sentences, tags, words, upos = [], [], [], []
    for line in path.read_text(encoding="utf-8").splitlines() + [""]:
        if not line.strip():
            if words:
                sentences.append(words)
                tags.append(upos)
                words, upos = [], []
                if limit is not None and len(sentences) == limit:
                    break
            continue
        if line.startswith("#"):
            continue
        columns = line.split("\t")
        if "-" in columns[0] or "." in columns[0]:
            continue
        words.append(columns[1])
        upos.append(columns[3])
    return sentences, tags


ABLATIONS = {
    "all layers, learned weights (input)": {},
    "all layers, equal frozen weights (input)": {"scalar_mix_trainable": False},
    "top layer only (input)": "top",
    "layer 0 (char CNN) only (input)": {"scalar_mix_layers": [0]},
    "all layers, learned weights (input + output)": {"elmo_placement": ["input", "output"]},
}


def predicted_tags(logits: np.ndarray, sentences: list[list[str]], labels: list[str]) -> list[list[str]]:
    """`(N, T + 2, num_labels)` logits -> each sentence's predicted tags, one per word (positions 1 .. n: row 0 is
    `<S>`, then the words, `</S>` and padding)."""
    best = logits.argmax(-1)
    return [[labels[k] for k in best[row, 1 : len(words) + 1]] for row, words in enumerate(sentences)]


def word_accuracy(predicted: list[list[str]], gold: list[list[str]]) -> float:
    pairs = [
        (p, g) for tags, gold_tags in zip(predicted, gold, strict=True) for p, g in zip(tags, gold_tags, strict=True)
    ]
    return sum(p == g for p, g in pairs) / len(pairs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="ELMo folder (converted or trained biLM)")
    parser.add_argument("--train-sentences", type=int, default=None, help="first N sentences of EWT dev (all)")
    parser.add_argument("--eval-sentences", type=int, default=None, help="first N sentences of EWT test (all)")
    parser.add_argument("--epochs", type=float, default=5.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--encoder-hidden-size", type=int, default=64, help="task BiLSTM size per direction")
    parser.add_argument("--ablations", nargs="*", default=list(ABLATIONS), choices=list(ABLATIONS), metavar="NAME")
    parser.add_argument("--output-dir", default="outputs/pos_tagging")
    parser.add_argument("--predictions", help="also write each ablation's predicted tags to this JSON file")
    parser.add_argument(
        "--save-taggers", action="store_true", help="also save each ablation's tagger into its folder of --output-dir"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="CPU threads (1 is fastest for small models, shared CPUs)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    train_words, train_tags = read_conllu(DATA / "en_ewt-ud-dev.conllu", args.train_sentences)
    eval_words, eval_tags = read_conllu(DATA / "en_ewt-ud-test.conllu", args.eval_sentences)
    labels = sorted({tag for sentence in train_tags + eval_tags for tag in sentence})
    label2id = {label: i for i, label in enumerate(labels)}

    def encode(batch):
        return tokenize_and_align_labels(tokenizer, batch["words"], batch["upos"], label2id=label2id)

    started = time.perf_counter()
    biLM = ElmoModel.from_pretrained(args.model)
    cache = ElmoLayerCache(biLM, batch_size=args.batch_size)
    splits = {}
    for name, (words, tags) in {"train": (train_words, train_tags), "eval": (eval_words, eval_tags)}.items():
        dataset = Dataset.from_dict({"words": words, "upos": tags})
        dataset = dataset.map(encode, batched=True, remove_columns=["words", "upos"])
        dataset = dataset.map(cache, batched=True, batch_size=256)
        splits[name] = dataset.with_format("numpy")
    print(
        f"biLM layers cached for {len(train_words)} + {len(eval_words)} sentences "
        f"in {time.perf_counter() - started:.0f} s"
    )

    rows, predictions = [], {}
    for name in args.ablations:
        overrides = ABLATIONS[name]
        if overrides == "top":
            overrides = {"scalar_mix_layers": [biLM.config.num_layers]}
        set_seed(args.seed)
        model = AutoModelForTokenClassification.from_pretrained(
            args.model,
            num_labels=len(labels),
            id2label=dict(enumerate(labels)),
            label2id=label2id,
            task_encoder_hidden_size=args.encoder_hidden_size,
            **overrides,
        )
        training_args = TrainingArguments(
            output_dir=str(Path(args.output_dir) / name.replace(" ", "_")),
            num_train_epochs=args.epochs,
            per_device_train_batch_size=args.batch_size,
            per_device_eval_batch_size=args.batch_size * 4,
            learning_rate=args.learning_rate,
            lr_scheduler_type="linear",
            save_strategy="no",
            report_to=[],
            seed=args.seed,
            disable_tqdm=True,
            logging_strategy="no",
            dataloader_num_workers=0,
            use_cpu=True,
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=splits["train"],
            eval_dataset=splits["eval"],
            data_collator=DataCollatorForElmo(tokenizer),
        )
        started = time.perf_counter()
        trainer.train()
        if args.save_taggers:
            trainer.save_model()
        predictions[name] = predicted_tags(trainer.predict(splits["eval"]).predictions, eval_words, labels)
        score = word_accuracy(predictions[name], eval_tags)
        mixes = model.task_encoder.scalar_mixes.items()
        weights = ", ".join(
            f"{place} {np.round(mix.scalar_parameters.softmax(0).tolist(), 3).tolist()}" for place, mix in mixes
        )
        weights = weights if len(model.task_encoder.mixed_layers) > 1 else "—"
        rows.append((name, score, weights))
        print(f"{name}: UPOS accuracy {score:.4f}, softmax(w) {weights}, {time.perf_counter() - started:.0f} s")

    print(
        f"\nModel `{args.model}`; trained on {len(train_words)} EWT dev sentences, evaluated on {len(eval_words)} EWT "
        f"test sentences ({sum(map(len, eval_words))} words); BiLSTM {args.encoder_hidden_size} per direction, "
        f"{args.epochs:g} epochs, batch {args.batch_size}, lr {args.learning_rate:g}, seed {args.seed}.\n"
    )
    print("| ELMo representation | UPOS accuracy (%) | learned softmax(w) |")
    print("| --- | ---: | --- |")
    for name, value, weights in rows:
        print(f"| {name} | {100 * value:.2f} | {weights} |")
    if args.predictions:
        Path(args.predictions).write_text(json.dumps(predictions), encoding="utf-8")


if __name__ == "__main__":
    main()
