"""Token classification pipeline for ELMo taggers.

The built-in `token-classification` pipeline reads one id per token (`int(input_ids[idx])`) and needs
`special_tokens_mask`; ELMo's inputs are `(words, 50)` character ids, so taggers get this class instead.
"""

from typing import Any

from transformers import Pipeline


class ElmoTokenClassificationPipeline(Pipeline):
    """Raw text -> one prediction per word.

    Each text is split into words by the tokenizer (`ElmoTokenizer.split_words`); the result is a list with, per
    word, `{"entity": label, "score": probability, "index": input position, "word": word, "start": ..., "end": ...}`
    (character offsets in the text). Words whose label is in `ignore_labels` (default `["O"]`, as in the built-in
    pipeline) are left out.

        tagger = pipeline("token-classification", model=model, tokenizer=tokenizer,
                          pipeline_class=ElmoTokenClassificationPipeline)
        tagger("The cat sat.")
    """

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def _sanitize_parameters(self, ignore_labels: list[str] | None = None, **kwargs):
        if kwargs:
            raise ValueError(f"ElmoTokenClassificationPipeline got unknown arguments {sorted(kwargs)}.")
        postprocess_params = {} if ignore_labels is None else {"ignore_labels": list(ignore_labels)}
        return {}, {}, postprocess_params

    def preprocess(self, text: str) -> dict[str, Any]:
        if not isinstance(text, str):
            raise TypeError(f"ElmoTokenClassificationPipeline expects raw text (str), got {type(text).__name__}.")
        words = self.tokenizer.split_words(text)
        encoding = self.tokenizer([words], is_split_into_words=True, return_tensors="pt")
        return {**encoding, "words": words, "text": text}  # input_ids, attention_mask (and input_word_ids)

    def _forward(self, model_inputs: dict[str, Any]) -> dict[str, Any]:
        words, text = model_inputs.pop("words"), model_inputs.pop("text")
        logits = self.model(**model_inputs).logits
        return {"logits": logits, "words": words, "text": text}

    def postprocess(
        self, model_outputs: dict[str, Any], ignore_labels: list[str] | None = None
    ) -> list[dict[str, Any]]:
        ignore_labels = ["O"] if ignore_labels is None else ignore_labels
        words, id2label = model_outputs["words"], self.model.config.id2label
        scores = model_outputs["logits"][0, 1 : len(words) + 1].float().softmax(dim=-1)  # the words, after <S>
        best, label_ids = (values.tolist() for values in scores.max(dim=-1))
        entities = []
        for index, (word, (start, end)) in enumerate(zip(words, word_spans(model_outputs["text"], words))):
            label = id2label[label_ids[index]]
            if label not in ignore_labels:
                entities.append(
                    {
                        "entity": label,
                        "score": best[index],
                        "index": index + 1,
                        "word": word,
                        "start": start,
                        "end": end,
                    }
                )
        return entities


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


__all__ = ["ElmoTokenClassificationPipeline", "word_spans"]
