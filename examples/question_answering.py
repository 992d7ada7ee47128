"""Answer spans (SQuAD's task) with ElmoForQuestionAnswering and Trainer.

    python examples/question_answering.py --model DIR [--train-questions N] [--eval-questions N] [--epochs 10]
                                          [--dataset ewt]

DIR is any ELMo folder. ELMo is computed for the question and for the context on their own; the model is BiDAF's
attention flow with start and end logits over the context words. The biLM is frozen, so the layers of both sides are
computed once (`ElmoLayerCache`); answers are decoded with the best span (start <= end, at most `--max-answer-len`
words).

`--dataset ewt` (the default, no network needed) builds questions from the bundled UD English EWT sentences (train
from dev, held-out evaluation from test): for each sentence of at least 4 words, a word `w` that occurs once in it
(case-insensitively) and is followed by at least two words is drawn, and the question is either `What comes after
w ?` (the answer: the next word) or `What are the two words after w ?` (the next two words). The score is exact match
of the answer span; a uniformly drawn start word with the right length would score the mean of 1 / (number of
words), printed as chance.

`--dataset squad` reads `datasets.load_dataset("squad")` (train / validation) instead: contexts are cut into words
by the tokenizer, the first gold answer is mapped to the words that hold it, training keeps the questions whose
answer lies in the first `--max-context-words` words, and evaluation runs the question-answering pipeline (windows
over long contexts) and scores exact match against any gold answer (whitespace and case ignored).

Prints the held-out exact match; `--predictions FILE` writes every evaluated question with its gold and predicted
answer.
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
from transformers import AutoModelForQuestionAnswering, AutoTokenizer, Trainer, TrainingArguments, set_seed

import hf_elmo  # noqa: F401  (registers ELMo with the Auto classes)
from hf_elmo import ElmoModel, ElmoQuestionAnsweringPipeline
from hf_elmo.features.task_data import DataCollatorForElmo, ElmoLayerCache
from hf_elmo.pipelines_elmo import best_answer_spans, word_spans


def ewt_questions(sentences: list[list[str]], limit: int | None, seed: int) -> list[dict]:
    """`{"question", "context", "answer"}` (word lists; the answer as `(first, last)` context words) built as the
    module docstring describes."""
    rng = random.Random(seed)
    examples = []
    for words in sentences:
        if limit is not None and len(examples) == limit:
            break
        lowered = [word.lower() for word in words]
        candidates = [i for i in range(len(words) - 2) if lowered.count(lowered[i]) == 1]
        if len(words) < 4 or not candidates:
            continue
        anchor = rng.choice(candidates)
        length = rng.randint(1, 2)
        question = ["What", "comes", "after", words[anchor], "?"]
        if length == 2:
            question = ["What", "are", "the", "two", "words", "after", words[anchor], "?"]
        examples.append({"question": question, "context": words, "answer": (anchor + 1, anchor + length)})
    return examples


def squad_questions(split: str, limit: int | None, tokenizer, max_context_words: int | None) -> list[dict]:
    from datasets import load_dataset

    data = load_dataset("squad", split=split)
    examples = []
    for example in data:
        if limit is not None and len(examples) == limit:
            break
        context = tokenizer.split_words(example["context"])
        spans = word_spans(example["context"], context)
        begin = example["answers"]["answer_start"][0]
        end = begin + len(example["answers"]["text"][0])
        inside = [i for i, (s, e) in enumerate(spans) if s is not None and s < end and e > begin]
        if not inside or (max_context_words is not None and inside[-1] >= max_context_words):
            continue
        examples.append(
            {
                "question": tokenizer.split_words(example["question"]),
                "context": context[:max_context_words],
                "answer": (inside[0], inside[-1]),
                "text": example["context"],
                "question_text": example["question"],
                "gold": example["answers"]["text"],
            }
        )
    return examples


def encode(tokenizer, examples: list[dict], cache) -> Dataset:
    encoded = tokenizer([e["question"] for e in examples], [e["context"] for e in examples], is_split_into_words=True)
    # Positions in pair_input_ids: context word j sits at j + 1 (after <S>).
    positions = {
        "start_positions": [e["answer"][0] + 1 for e in examples],
        "end_positions": [e["answer"][1] + 1 for e in examples],
    }
    return Dataset.from_dict({**encoded, **positions}).map(cache, batched=True, batch_size=256).with_format("numpy")


def predicted_spans(model, dataset: Dataset, collator, max_answer_len: int, batch_size: int) -> list[tuple[int, int]]:
    """The best span `(first, last)` of context words of each example."""
    model.eval()
    spans = []
    for start in range(0, len(dataset), batch_size):
        rows = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        batch = collator([{k: v for k, v in row.items() if not k.endswith("_positions")} for row in rows])
        with torch.no_grad():
            output = model(**batch)
        for row in range(len(rows)):
            n = int(batch["pair_attention_mask"][row].sum()) - 2
            start_scores = output.start_logits[row].double().log_softmax(-1)[1 : n + 1]
            end_scores = output.end_logits[row].double().log_softmax(-1)[1 : n + 1]
            first, last, _ = best_answer_spans(start_scores, end_scores, max_answer_len)[0]
            spans.append((first, last))
    return spans


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="ELMo folder (converted or trained biLM)")
    parser.add_argument("--dataset", choices=["ewt", "squad"], default="ewt")
    parser.add_argument("--train-questions", type=int, default=None, help="at most N training questions (all)")
    parser.add_argument("--eval-questions", type=int, default=None, help="at most N held-out questions (all)")
    parser.add_argument("--epochs", type=float, default=10.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--dropout", type=float, default=0.1, help="elmo_dropout (0.5 in the paper, for far more data)")
    parser.add_argument("--encoder-hidden-size", type=int, default=32, help="BiLSTM sizes per direction")
    parser.add_argument("--max-answer-len", type=int, default=15)
    parser.add_argument("--max-context-words", type=int, default=256, help="squad: training context length")
    parser.add_argument("--output-dir", default="outputs/question_answering")
    parser.add_argument("--predictions", help="also write the held-out questions with gold and predicted answers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (1 is fastest for small models)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if args.dataset == "ewt":
        train = ewt_questions(read_conllu(DATA / "en_ewt-ud-dev.conllu")[0], args.train_questions, args.seed)
        held_out = ewt_questions(read_conllu(DATA / "en_ewt-ud-test.conllu")[0], args.eval_questions, args.seed + 1)
    else:
        train = squad_questions("train", args.train_questions, tokenizer, args.max_context_words)
        held_out = squad_questions("validation", args.eval_questions, tokenizer, None)

    started = time.perf_counter()
    cache = ElmoLayerCache(ElmoModel.from_pretrained(args.model), batch_size=args.batch_size)
    train_data = encode(tokenizer, train, cache)
    print(f"biLM layers cached for {len(train)} questions in {time.perf_counter() - started:.0f} s")

    set_seed(args.seed)
    model = AutoModelForQuestionAnswering.from_pretrained(
        args.model, elmo_dropout=args.dropout, task_encoder_hidden_size=args.encoder_hidden_size
    )
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        save_strategy="no",
        report_to=[],
        seed=args.seed,
        disable_tqdm=True,
        logging_strategy="no",
        use_cpu=True,
    )
    collator = DataCollatorForElmo(tokenizer)
    started = time.perf_counter()
    Trainer(model=model, args=training_args, train_dataset=train_data, data_collator=collator).train()
    print(f"trained in {time.perf_counter() - started:.0f} s")

    rows = []
    if args.dataset == "ewt":
        spans = predicted_spans(model, encode(tokenizer, held_out, cache), collator, args.max_answer_len, 128)
        for example, (first, last) in zip(held_out, spans):
            gold = " ".join(example["context"][example["answer"][0] : example["answer"][1] + 1])
            predicted = " ".join(example["context"][first : last + 1])
            rows.append({"question": " ".join(example["question"]), "gold": [gold], "predicted": predicted})
        chance = float(np.mean([1 / len(e["context"]) for e in held_out]))
    else:
        qa = ElmoQuestionAnsweringPipeline(model=model.eval(), tokenizer=tokenizer)
        for example in held_out:
            answer = qa(question=example["question_text"], context=example["text"], max_answer_len=args.max_answer_len)
            rows.append({"question": example["question_text"], "gold": example["gold"], "predicted": answer["answer"]})
        chance = None

    def normalised(text):
        return " ".join(text.lower().split())

    exact = float(np.mean([normalised(r["predicted"]) in {normalised(g) for g in r["gold"]} for r in rows]))
    chance_text = f" (chance {100 * chance:.2f}%)" if chance is not None else ""
    print(
        f"Model `{args.model}`, {args.dataset} questions: trained on {len(train)}, held-out exact match "
        f"{100 * exact:.2f}% on {len(held_out)}{chance_text}"
    )
    if args.predictions:
        Path(args.predictions).write_text(json.dumps(rows), encoding="utf-8")


if __name__ == "__main__":
    main()
