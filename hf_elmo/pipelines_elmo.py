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
        scores = model_outputs["logits"][0].float().softmax(dim=-1)
        text, entities, cursor = model_outputs["text"], [], 0
        for index, word in enumerate(model_outputs["words"]):
            position = index + 1  # after <S>
            label_id = int(scores[position].argmax())
            # Words are verbatim pieces of the text, in order: find each after the previous one (text that lost
            # characters to the splitter's Unicode cleaning may not contain a word: no offsets then).
            start = end = text.find(word, cursor)
            if start < 0:
                start = end = None
            else:
                end = cursor = start + len(word)
            label = self.model.config.id2label[label_id]
            if label not in ignore_labels:
                entities.append(
                    {
                        "entity": label,
                        "score": float(scores[position, label_id]),
                        "index": position,
                        "word": word,
                        "start": start,
                        "end": end,
                    }
                )
        return entities


__all__ = ["ElmoTokenClassificationPipeline"]
