"""The token-classification and question-answering pipelines given careless or hostile input: a `ValueError` naming the
problem.
"""

import pytest
from hostile import answer, check_api_refusal, question_answering_pipeline, tag

API_CASES = {
    # --- pipelines, sentence embeddings and model cards ---
    "token-classification pipeline: lists of words without is_split_into_words": (
        [],
        tag([["The", "cat"]]),
        r"^ElmoTokenClassificationPipeline expects raw text \(str\), or lists of words with "
        r"is_split_into_words=True; got list\.$",
    ),
    "token-classification pipeline: raw text with is_split_into_words=True": (
        [],
        tag("The cat", is_split_into_words=True),
        r"^With is_split_into_words=True each input must be a list of "
        r"words \(str\), got str\.$",
    ),
    "token-classification pipeline: a word that is not a str": (
        [],
        tag(["The", 3], is_split_into_words=True),
        r"^With is_split_into_words=True each word must be a str, got "
        r"int at 1\.$",
    ),
    "token-classification pipeline: an unknown aggregation_strategy": (
        [],
        tag("The cat", aggregation_strategy="longest"),
        r"^aggregation_strategy must be one of \['none', "
        r"'simple', 'first', 'average', 'max'\], got 'longest'$",
    ),
    "token-classification pipeline: stride, which reads subword tokens": (
        [],
        tag("The cat", stride=2),
        r"^ElmoTokenClassificationPipeline got unsupported arguments \['stride'\]",
    ),
    # --- sentence pairs and question answering ---
    "a question-answering pipeline given an empty context": (
        [],
        answer(question="Who sat?", context="  "),
        r"^the context has no words$",
    ),
    "a question-answering pipeline given more questions than contexts": (
        [],
        answer(question=["Who sat?", "Where?"], context=["The cat sat."]),
        r"^2 questions but 1 contexts: each needs its context$",
    ),
    "a question-answering pipeline whose windows would not move": (
        [],
        answer(question="Who sat?", context="The cat sat.", max_context_words=4, stride=4),
        r"^stride must be in \[0, max_context_words\) = \[0, 4\), got 4$",
    ),
    # --- the question-answering task (pipeline("question-answering"), "elmo-question-answering") ---
    "the question-answering task given an ELMo model without the question-answering head": (
        [],
        question_answering_pipeline("question-answering", "ElmoModel"),
        r"^ElmoQuestionAnsweringPipeline needs an ElmoForQuestionAnswering model \(start and end logits over the "
        r"context\), got ElmoModel$",
    ),
    "the elmo-question-answering task given a tagger": (
        [],
        question_answering_pipeline("elmo-question-answering", "ElmoForTokenClassification"),
        r"^ElmoQuestionAnsweringPipeline needs an ElmoForQuestionAnswering model \(start and end logits over the "
        r"context\), got ElmoForTokenClassification$",
    ),
    # --- the question-answering pipeline's arguments: top_k, max_context_words ---
    "a question-answering pipeline asked for no answer at all (top_k=0)": (
        [],
        answer(question="Who sat?", context="The cat sat.", top_k=0),
        r"^top_k must be >= 1, got 0$",
    ),
    "a question-answering pipeline given windows of no word (max_context_words=0)": (
        [],
        answer(question="Who sat?", context="The cat sat.", max_context_words=0),
        r"^max_context_words must be >= 1, got 0$",
    ),
}


@pytest.mark.parametrize("name", API_CASES)
def test_api_refuses_with_a_clear_value_error(name, workspace):
    check_api_refusal(API_CASES[name], workspace)
