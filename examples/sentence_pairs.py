"""Sentence-pair classification (SNLI's task) with ElmoForSequenceClassification(sentence_pairs=True) and Trainer.

    python examples/sentence_pairs.py --model DIR [--train-pairs N] [--eval-pairs N] [--epochs 10] [--dataset ewt]

DIR is any ELMo folder. ELMo is computed for each sentence of a pair on its own; the classifier is ESIM's comparison
(soft alignment, `[a; a~; a - a~; a * a~]`, mean and max pooling). The biLM is frozen, so the layers of both sides
are computed once (`ElmoLayerCache`).

`--dataset ewt` (the default, no network needed) builds three-way pairs from the bundled UD English EWT sentences
(train from dev, held-out evaluation from test; one pair per sentence of at least 6 words, label drawn uniformly):

  * 0 `entailment`: the hypothesis is a span of 3 to 8 consecutive words of the premise;
  * 1 `neutral`: the hypothesis is such a span of another sentence of the same split;
  * 2 `contradiction`: a span of the premise with one of its words replaced by a word of another sentence.

Chance is 33.3%. `--dataset snli` reads `datasets.load_dataset("snli")` instead (train / validation, pairs without
a gold label left out). Prints the held-out accuracy; `--predictions FILE` writes every evaluated pair with its gold
and predicted label.
"""

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from pos_tagging import DATA, read_conllu
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments, set_seed

import hf_elmo  # noqa: F401  (registers ELMo with the Auto classes)
from hf_elmo import ElmoModel
from hf_elmo.features.task_data import DataCollatorForElmo, ElmoLayerCache

LABELS = ["entailment", "neutral", "contradiction"]


def ewt_pairs(sentences: list[list[str]], limit: int | None, seed: int) -> list[tuple[list[str], list[str], int]]:
    """`(premise, hypothesis, label)` triples built from `sentences` as the module docstring describes."""
    rng = random.Random(seed)
    long_enough = [words for words in sentences if len(words) >= 6]
    pairs = []
    for index, premise in enumerate(long_enough):
        if limit is not None and len(pairs) == limit:
            break
        label = rng.randrange(3)
        other = long_enough[(index + rng.randrange(1, len(long_enough))) % len(long_enough)]
        source = other if label == 1 else premise
        length = rng.randint(3, min(8, len(source)))
        start = rng.randrange(len(source) - length + 1)
        hypothesis = list(source[start : start + length])
        if label == 2:
            replacements = [word for word in other if word not in premise]
            position = rng.randrange(length)
            hypothesis[position] = rng.choice(replacements) if replacements else "nothing"
        pairs.append((premise, hypothesis, label))
    return pairs


def snli_pairs(split: str, limit: int | None) -> list[tuple[list[str], list[str], int]]:
    from datasets import load_dataset

    data = load_dataset("snli", split=split).filter(lambda example: example["label"] != -1)
    if limit is not None:
        data = data.select(range(min(limit, len(data))))
    return [(example["premise"], example["hypothesis"], example["label"]) for example in data]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="ELMo folder (converted or trained biLM)")
    parser.add_argument("--dataset", choices=["ewt", "snli"], default="ewt")
    parser.add_argument("--train-pairs", type=int, default=None, help="at most N training pairs (all)")
    parser.add_argument("--eval-pairs", type=int, default=None, help="at most N held-out pairs (all)")
    parser.add_argument("--epochs", type=float, default=10.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--dropout", type=float, default=0.1, help="elmo_dropout (0.5 in the paper, for far more data)")
    parser.add_argument("--encoder-hidden-size", type=int, default=32, help="task BiLSTM size per direction (0: none)")
    parser.add_argument("--output-dir", default="outputs/sentence_pairs")
    parser.add_argument("--predictions", help="also write the held-out pairs with gold and predicted labels (JSON)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (1 is fastest for small models)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    if args.dataset == "ewt":
        train = ewt_pairs(read_conllu(DATA / "en_ewt-ud-dev.conllu")[0], args.train_pairs, args.seed)
        held_out = ewt_pairs(read_conllu(DATA / "en_ewt-ud-test.conllu")[0], args.eval_pairs, args.seed + 1)
        split_words = True
    else:
        train, held_out = snli_pairs("train", args.train_pairs), snli_pairs("validation", args.eval_pairs)
        split_words = False

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    started = time.perf_counter()
    cache = ElmoLayerCache(ElmoModel.from_pretrained(args.model), batch_size=args.batch_size)
    splits = {}
    for name, pairs in {"train": train, "eval": held_out}.items():
        premises, hypotheses, labels = (list(column) for column in zip(*pairs))
        encoded = tokenizer(premises, hypotheses, is_split_into_words=split_words)
        dataset = Dataset.from_dict({**encoded, "labels": labels}).map(cache, batched=True, batch_size=256)
        splits[name] = dataset.with_format("numpy")
    print(f"biLM layers cached for {len(train)} + {len(held_out)} pairs in {time.perf_counter() - started:.0f} s")

    set_seed(args.seed)
    model = AutoModelForSequenceClassification.from_pretrained(
        args.model,
        num_labels=3,
        id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)},
        sentence_pairs=True,
        elmo_dropout=args.dropout,
        task_encoder_hidden_size=args.encoder_hidden_size,
    )
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size * 4,
        learning_rate=args.learning_rate,
        save_strategy="no",
        report_to=[],
        seed=args.seed,
        disable_tqdm=True,
        logging_strategy="no",
        use_cpu=True,
    )
    collator = DataCollatorForElmo(tokenizer)
    trainer = Trainer(model=model, args=training_args, train_dataset=splits["train"], data_collator=collator)
    started = time.perf_counter()
    trainer.train()
    predicted = np.asarray(trainer.predict(splits["eval"]).predictions).argmax(-1).tolist()
    gold = [label for _, _, label in held_out]
    accuracy = float(np.mean([p == g for p, g in zip(predicted, gold)]))
    print(f"trained in {time.perf_counter() - started:.0f} s")
    print(
        f"Model `{args.model}`, {args.dataset} pairs: trained on {len(train)}, held-out accuracy "
        f"{100 * accuracy:.2f}% on {len(held_out)} (chance 33.33%)"
    )
    if args.predictions:
        rows = [
            {"premise": p, "hypothesis": h, "gold": LABELS[g], "predicted": LABELS[k]}
            for (p, h, g), k in zip(held_out, predicted)
        ]
        Path(args.predictions).write_text(json.dumps(rows), encoding="utf-8")


if __name__ == "__main__":
    main()
