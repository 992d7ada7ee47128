"""Token classification and question answering pipelines for the ELMo heads.

The built-in `token-classification` pipeline reads one id per token (`int(input_ids[idx])`); ELMo's inputs are
`(words, 50)` character ids. `ElmoTokenClassificationPipeline` is that pipeline with ELMo's reading of the inputs (one
token per word, offsets found in the text); its results, aggregation and filtering are the built-in pipeline's.
Importing hf_elmo makes the built-in task build it for ELMo models (`TokenClassificationPipelineForAnyModel`).

The `question-answering` pipeline of transformers 4 needed a fast tokenizer's offsets and BERT's one-sequence layout of
a pair, and transformers 5 removed the task. ELMo reads each sentence of a pair on its own: `ElmoForQuestionAnswering`
gets `ElmoQuestionAnsweringPipeline`, which importing hf_elmo puts under the task for ELMo models only
(`QuestionAnsweringPipelineForElmoModels`).
"""

from typing import Any

import numpy as np
import torch
from transformers import Pipeline
from transformers.pipelines.token_classification import AggregationStrategy, TokenClassificationPipeline

from .pretrained_elmo import untrained_head


class ElmoTokenClassificationPipeline(TokenClassificationPipeline):
    """Raw text, or pre-split words with `is_split_into_words=True`, -> one prediction per word.

    Raw text is split into words by the tokenizer (`ElmoTokenizer.split_words`); pre-split words are joined with
    `delimiter` (default `" "`) for the offsets, as the built-in pipeline does. With `aggregation_strategy="none"`
    (the default) the result is, per word, `{"entity", "score", "index" (input position: the first word is 1, after
    <S>), "word", "start", "end"}` (character offsets; `None` for a word that is not a piece of the text); the other
    strategies group adjacent words of one entity (`B-`/`I-` tags) into `{"entity_group", "score", "word", "start",
    "end"}`. ELMo reads whole words, so `"first"`, `"average"` and `"max"` (which settle disagreeing subwords of a
    word) give what `"simple"` gives. Words whose label is in `ignore_labels` (default `["O"]`) are left out.

        tagger = pipeline("token-classification", model=model, tokenizer=tokenizer, aggregation_strategy="simple")
        tagger("The cat sat.")
        tagger(["The", "cat", "sat", "."], is_split_into_words=True)
    """

    def _sanitize_parameters(
        self,
        ignore_labels=None,
        aggregation_strategy: AggregationStrategy | str | None = None,
        is_split_into_words: bool = False,
        delimiter: str | None = None,
        **unsupported,
    ):
        if unsupported:  # offset_mapping and stride read subword tokens, which ELMo does not have
            raise ValueError(
                f"ElmoTokenClassificationPipeline got unsupported arguments {sorted(unsupported)}; it takes "
                "ignore_labels, aggregation_strategy, is_split_into_words and delimiter."
            )
        if delimiter is not None and not isinstance(delimiter, str):
            raise ValueError(f"delimiter must be a str (what joins the words), got {type(delimiter).__name__}")
        preprocess_params = {
            "is_split_into_words": is_split_into_words,
            "delimiter": " " if delimiter is None else delimiter,
        }
        postprocess_params = {}
        if aggregation_strategy is not None:
            if not isinstance(aggregation_strategy, AggregationStrategy):
                if (
                    not isinstance(aggregation_strategy, str)
                    or aggregation_strategy.upper() not in AggregationStrategy.__members__
                ):
                    raise ValueError(
                        f"aggregation_strategy must be one of {[s.value for s in AggregationStrategy]}, "
                        f"got {aggregation_strategy!r}"
                    )
                aggregation_strategy = AggregationStrategy[aggregation_strategy.upper()]
            postprocess_params["aggregation_strategy"] = aggregation_strategy
        if ignore_labels is not None:
            if isinstance(ignore_labels, str) or not all(isinstance(label, str) for label in ignore_labels):
                raise ValueError(f"ignore_labels must be a list of labels (str), got {ignore_labels!r}")
            postprocess_params["ignore_labels"] = list(ignore_labels)
        return preprocess_params, {}, postprocess_params

    def preprocess(self, sentence, is_split_into_words: bool = False, delimiter: str = " "):
        if is_split_into_words:
            if not isinstance(sentence, list):
                raise ValueError(
                    "With is_split_into_words=True each input must be a list of words (str), "
                    f"got {type(sentence).__name__}."
                )
            for index, word in enumerate(sentence):
                if not isinstance(word, str):
                    raise ValueError(
                        f"With is_split_into_words=True each word must be a str, got {type(word).__name__} at {index}."
                    )
            words, text = sentence, delimiter.join(sentence)
            starts = np.cumsum([0] + [len(word) + len(delimiter) for word in words[:-1]]).tolist()
            spans = [(start, start + len(word)) for start, word in zip(starts, words)]
        else:
            if not isinstance(sentence, str):
                raise ValueError(
                    "ElmoTokenClassificationPipeline expects raw text (str), or lists of words with "
                    f"is_split_into_words=True; got {type(sentence).__name__}."
                )
            words, text = self.tokenizer.split_words(sentence), sentence
            spans = word_spans(text, words)
        encoding = self.tokenizer([words], is_split_into_words=True, return_tensors="pt")
        # One chunk per input (ELMo reads a sentence of any length at once); input_ids, attention_mask (and
        # input_word_ids).
        yield {**encoding, "words": words, "spans": spans, "is_last": True}

    def _forward(self, model_inputs: dict[str, Any]) -> dict[str, Any]:
        words, spans, is_last = (model_inputs.pop(key) for key in ("words", "spans", "is_last"))
        return {"logits": self.model(**model_inputs).logits, "words": words, "spans": spans, "is_last": is_last}

    def postprocess(self, all_outputs, aggregation_strategy=AggregationStrategy.NONE, ignore_labels=None):
        ignore_labels = ["O"] if ignore_labels is None else ignore_labels
        (outputs,) = all_outputs
        words = outputs["words"]
        scores = outputs["logits"][0, 1 : len(words) + 1].float().softmax(dim=-1).numpy()  # the words, after <S>
        pre_entities = [
            {"word": word, "scores": word_scores, "start": start, "end": end, "index": index + 1, "is_subword": False}
            for index, (word, word_scores, (start, end)) in enumerate(zip(words, scores, outputs["spans"]))
        ]
        return [
            entity
            for entity in self.aggregate(pre_entities, aggregation_strategy)
            if entity.get("entity", entity.get("entity_group")) not in ignore_labels
        ]


class TokenClassificationPipelineForAnyModel(TokenClassificationPipeline):
    """The built-in `token-classification` pipeline, or `ElmoTokenClassificationPipeline` for an ELMo model: what
    importing hf_elmo puts under the built-in task, so that `pipeline("token-classification", model=...)` works for
    ELMo as it does for BERT (the task picks its class before it loads the model)."""

    def __new__(cls, *args, **kwargs):
        if is_elmo_model(kwargs.get("model", args[0] if args else None)):
            return ElmoTokenClassificationPipeline(*args, **kwargs)  # not a `cls`: no second __init__
        return super().__new__(cls)


def refuse_untrained_head(model):
    """A head loaded from a folder saved from another class and not trained since (`pretrained_elmo.untrained_head`),
    e.g. by `pipeline("question-answering", model=folder)` on a tagger's folder: refused in one line by that task, as a
    model object of another class is. The pipeline class itself takes it, for whoever builds one by hand; the
    token-classification task takes it with transformers' load report, as it does for BERT."""
    reason = untrained_head(model)
    if reason is not None:
        raise ValueError(reason)


def is_elmo_model(model) -> bool:
    return getattr(getattr(model, "config", None), "model_type", None) == "elmo"


class ElmoQuestionAnsweringPipeline(Pipeline):
    """A question and a context (raw text) -> the answer: `{"score": probability, "start": ..., "end": ..., "answer":
    context[start:end]}` (character offsets into the context), as the built-in pipeline returns it.

        qa = pipeline("elmo-question-answering", model=model, tokenizer=tokenizer)
        qa(question="Who sat?", context="The cat sat on the mat.")

    Both texts are split into words by the tokenizer; the answer is the span of context words with the highest
    start probability times end probability, starting at or before its end and at most `max_answer_len` (15) words
    long. A context longer than `max_context_words` (256) is read in windows of that many words, each overlapping the
    next by `stride` (64) words, and the best answer of any window is returned. With `handle_impossible_answer=True`
    the empty answer (`"answer": ""`, `start = end = 0`) is returned when the model gives it a higher probability
    (the lowest over the windows) than the best span. `top_k` > 1 returns a list of the best answers, best first (a
    span read in several windows once, with its best score; the empty answer among them with
    `handle_impossible_answer`), as transformers' pipeline did: a single answer stays a dict.
    """

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __init__(self, model, *args, **kwargs):
        if "ElmoForQuestionAnswering" not in {base.__name__ for base in type(model).__mro__}:  # a folder's class too
            raise ValueError(
                "ElmoQuestionAnsweringPipeline needs an ElmoForQuestionAnswering model (start and end logits over the "
                f"context), got {type(model).__name__}"
            )
        super().__init__(model, *args, **kwargs)

    def __call__(self, *args, question=None, context=None, **kwargs):
        if question is context is None and len(args) == 2 and all(isinstance(arg, str) for arg in args):
            (question, context), args = args, ()  # qa(question, context), as transformers' pipeline took them
        if question is not None or context is not None:
            if args:
                raise ValueError("ElmoQuestionAnsweringPipeline takes question= and context=, or a dict, not both")
            if isinstance(question, (list, tuple)) and isinstance(context, str):  # several questions, one context
                context = [context] * len(question)
            if isinstance(question, (list, tuple)) and isinstance(context, (list, tuple)):
                if len(question) != len(context):
                    raise ValueError(f"{len(question)} questions but {len(context)} contexts: each needs its context")
                args = ([{"question": q, "context": c} for q, c in zip(question, context)],)
            else:
                args = ({"question": question, "context": context},)
        return super().__call__(*args, **kwargs)

    def _sanitize_parameters(
        self,
        max_answer_len: int | None = None,
        handle_impossible_answer: bool | None = None,
        max_context_words: int | None = None,
        stride: int | None = None,
        top_k: int | None = None,
        **kwargs,
    ):
        if kwargs:
            raise ValueError(f"ElmoQuestionAnsweringPipeline got unknown arguments {sorted(kwargs)}.")
        numbers = {"max_context_words": (max_context_words, 1), "stride": (stride, 0)}
        numbers.update({"max_answer_len": (max_answer_len, 1), "top_k": (top_k, 1)})
        for name, (value, least) in numbers.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name} must be an int, got {value!r}")
            if value is not None and value < least:
                raise ValueError(f"{name} must be >= {least}, got {value}")
        if handle_impossible_answer is not None and not isinstance(handle_impossible_answer, bool):
            raise ValueError(f"handle_impossible_answer must be True or False, got {handle_impossible_answer!r}")
        preprocess_params = _given(max_context_words=max_context_words, stride=stride)
        postprocess_params = _given(
            max_answer_len=max_answer_len, handle_impossible_answer=handle_impossible_answer, top_k=top_k
        )
        return preprocess_params, {}, postprocess_params

    def preprocess(self, inputs: Any, max_context_words: int = 256, stride: int = 64) -> dict[str, Any]:
        if not isinstance(inputs, dict) or set(inputs) != {"question", "context"}:
            raise ValueError('ElmoQuestionAnsweringPipeline expects {"question": str, "context": str} for each input')
        if max_context_words < 1:
            raise ValueError(f"max_context_words must be >= 1, got {max_context_words}")
        if not 0 <= stride < max_context_words:
            raise ValueError(f"stride must be in [0, max_context_words) = [0, {max_context_words}), got {stride}")
        words = {}
        for key in ("question", "context"):
            if not isinstance(inputs[key], str):
                raise TypeError(f"the {key} must be raw text (str), got {type(inputs[key]).__name__}")
            words[key] = self.tokenizer.split_words(inputs[key])
            if not words[key]:
                raise ValueError(f"the {key} has no words")
        context_words = words["context"]
        starts = context_windows(len(context_words), max_context_words, stride)
        return {
            "question_words": words["question"],
            "windows": [context_words[start : start + max_context_words] for start in starts],
            "starts": starts,
            "context_words": context_words,
            "context": inputs["context"],
        }

    def _forward(self, model_inputs: dict[str, Any]) -> dict[str, Any]:
        """Runs the question with each window, as many windows a forward as `POSITIONS_PER_FORWARD` allows (the
        question is copied into each): `start_logits` and `end_logits`, one `(positions,)` tensor per window."""
        question, windows = model_inputs.pop("question_words"), model_inputs.pop("windows")
        positions = len(question) + max(len(window) for window in windows) + 4  # each with <S> and </S>
        group = max(1, POSITIONS_PER_FORWARD // positions)
        start_logits, end_logits = [], []
        for first in range(0, len(windows), group):
            part = windows[first : first + group]
            encoding = self.tokenizer(
                [question] * len(part), part, is_split_into_words=True, padding=True, return_tensors="pt"
            )
            outputs = self.model(**encoding.to(self.device))
            start_logits.extend(outputs.start_logits)
            end_logits.extend(outputs.end_logits)
        return {"start_logits": start_logits, "end_logits": end_logits, **model_inputs}

    def postprocess(
        self,
        model_outputs: dict[str, Any],
        max_answer_len: int = 15,
        handle_impossible_answer: bool = False,
        top_k: int = 1,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        context, context_words = model_outputs["context"], model_outputs["context_words"]
        best, no_answer = {}, 1.0
        for window, start in enumerate(model_outputs["starts"]):
            n = min(len(context_words) - start, len(model_outputs["start_logits"][window]) - 2)
            start_scores = model_outputs["start_logits"][window].double().log_softmax(dim=-1)
            end_scores = model_outputs["end_logits"][window].double().log_softmax(dim=-1)
            no_answer = min(no_answer, float((start_scores[0] + end_scores[0]).exp()))
            spans = best_answer_spans(start_scores[1 : n + 1], end_scores[1 : n + 1], max_answer_len, top_k)
            for first, last, score in spans:
                span = (start + first, start + last)
                best[span] = max(score, best.get(span, 0.0))
        offsets = word_spans(context, context_words)
        answers = []
        for (first, last), score in best.items():
            begin, end = offsets[first][0], offsets[last][1]
            if begin is None or end is None:  # a word that lost a lone surrogate: the answer as the words read it
                answer = " ".join(context_words[first : last + 1])
            else:
                answer = context[begin:end]
            answers.append({"score": score, "start": begin, "end": end, "answer": answer})
        if handle_impossible_answer:
            answers.append({"score": no_answer, "start": 0, "end": 0, "answer": ""})
        answers = sorted(answers, key=lambda answer: answer["score"], reverse=True)[:top_k]  # stable: spans win ties
        return answers[0] if len(answers) == 1 else answers


POSITIONS_PER_FORWARD = 2**15
"""The most question and context positions one forward of the question-answering model reads: the windows of a long
context run in groups that fit (one at a time where one alone holds more), so that the question copied into every
window does not multiply the memory of a call by the number of windows."""


class QuestionAnsweringPipelineForElmoModels(ElmoQuestionAnsweringPipeline):
    """What importing hf_elmo puts under `question-answering`, the task transformers 5 removed: for an ELMo model
    `ElmoQuestionAnsweringPipeline`; for any other model the KeyError transformers 5 raises for the task, whose message
    hf_elmo/__init__.py takes from transformers when it takes the task out of transformers' removed tasks. The task
    picks its class before it loads the model: a model given by name is loaded before it is refused."""

    removed_task_message: str

    def __new__(cls, *args, **kwargs):
        model = kwargs.get("model", args[0] if args else None)
        if is_elmo_model(model):
            refuse_untrained_head(model)
            return ElmoQuestionAnsweringPipeline(*args, **kwargs)  # not a `cls`: no second __init__
        raise KeyError(cls.removed_task_message)


class QuestionAnsweringTaskEntry(dict):
    """The task's entry in transformers' pipeline registry. It has no default model: `pipeline("question-answering")`
    without a model gets the KeyError of `QuestionAnsweringPipelineForElmoModels` where it asks for the default."""

    def __missing__(self, key):
        raise KeyError(QuestionAnsweringPipelineForElmoModels.removed_task_message if key == "default" else key)


def _given(**params) -> dict[str, Any]:
    """The parameters a call set (the others keep their defaults)."""
    return {key: value for key, value in params.items() if value is not None}


def context_windows(n_words: int, window: int, stride: int) -> list[int]:
    """First words of the windows of `window` words, each overlapping the next by `stride` words, that cover `n_words`
    words."""
    starts = [0]
    while starts[-1] + window < n_words:
        starts.append(starts[-1] + window - stride)
    return starts


def best_answer_spans(
    start_scores: torch.Tensor, end_scores: torch.Tensor, max_length: int, top_k: int = 1
) -> list[tuple[int, int, float]]:
    """The `top_k` spans `(first, last)` of words with the highest `start_scores[first] + end_scores[last]`
    (log-probabilities `(n,)`) with `first <= last < first + max_length`, best first, with their probabilities (fewer
    where fewer spans exist)."""
    n = start_scores.shape[0]
    scores = start_scores[:, None] + end_scores[None, :]
    offsets = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    scores = scores.masked_fill((offsets < 0) | (offsets >= max_length), float("-inf"))
    spans = sum(min(max_length, n - first) for first in range(n))
    values, indices = scores.reshape(-1).topk(min(top_k, spans))
    return [(index // n, index % n, value) for value, index in zip(values.exp().tolist(), indices.tolist())]


def word_spans(text: str, words: list[str]) -> list[tuple[int | None, int | None]]:
    """The character offsets `(start, end)` of each of `words` in `text`, the words the splitter cut it into: pieces
    of the text, in order, with whitespace and lone surrogates (which the splitter drops) between them. A word that
    lost a lone surrogate from its inside is not a piece of the text: `(None, None)`. Each character of the text is
    looked at a bounded number of times (a search for a word that is not there would scan the rest of the text)."""
    spans, cursor = [], 0
    for word in words:
        start = cursor
        while start < len(text) and text[start] != word[:1] and _between_words(text[start]):
            start += 1
        if text.startswith(word, start):
            cursor = start + len(word)
            spans.append((start, cursor))
            continue
        spans.append((None, None))
        end = start
        for character in word:  # the word's characters, with the dropped surrogates among them
            while end < len(text) and _is_surrogate(text[end]):
                end += 1
            if end == len(text) or text[end] != character:
                break  # not there either: the next word is looked for from the same place
            end += 1
        else:
            cursor = end
    return spans


def _is_surrogate(character: str) -> bool:
    return "\ud800" <= character <= "\udfff"


def _between_words(character: str) -> bool:
    return character.isspace() or _is_surrogate(character)


__all__ = [
    "ElmoQuestionAnsweringPipeline",
    "ElmoTokenClassificationPipeline",
    "QuestionAnsweringPipelineForElmoModels",
    "QuestionAnsweringTaskEntry",
    "TokenClassificationPipelineForAnyModel",
    "best_answer_spans",
    "context_windows",
    "word_spans",
]
