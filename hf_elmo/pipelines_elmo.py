"""Token classification pipelines for ELMo taggers.

The built-in `token-classification` pipeline reads one id per token (`int(input_ids[idx])`); ELMo's inputs are
`(words, 50)` character ids. `ElmoTokenClassificationPipeline` is that pipeline with ELMo's reading of the inputs (one
token per word, offsets found in the text); its results, aggregation and filtering are the built-in pipeline's.
Importing hf_elmo makes the built-in task build it for ELMo models (`TokenClassificationPipelineForAnyModel`).
"""

from typing import Any

import numpy as np
from transformers.pipelines.token_classification import AggregationStrategy, TokenClassificationPipeline


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
        preprocess_params = {"is_split_into_words": is_split_into_words, "delimiter": delimiter or " "}
        postprocess_params = {}
        if aggregation_strategy is not None:
            if isinstance(aggregation_strategy, str):
                if aggregation_strategy.upper() not in AggregationStrategy.__members__:
                    raise ValueError(
                        f"aggregation_strategy must be one of {[s.value for s in AggregationStrategy]}, "
                        f"got {aggregation_strategy!r}"
                    )
                aggregation_strategy = AggregationStrategy[aggregation_strategy.upper()]
            postprocess_params["aggregation_strategy"] = aggregation_strategy
        if ignore_labels is not None:
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
        model = kwargs.get("model", args[0] if args else None)
        if getattr(getattr(model, "config", None), "model_type", None) == "elmo":
            return ElmoTokenClassificationPipeline(*args, **kwargs)  # not a `cls`: no second __init__
        return super().__new__(cls)


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


__all__ = ["ElmoTokenClassificationPipeline", "TokenClassificationPipelineForAnyModel", "word_spans"]
