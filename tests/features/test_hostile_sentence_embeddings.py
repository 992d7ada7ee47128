"""The sentence-transformers recipe given options that leave no word or read the boundary positions: a `ValueError`
naming the problem.
"""

import pytest
from hostile import check_api_refusal, sentence_model

API_CASES = {
    # --- pipelines, sentence embeddings and model cards ---
    "sentence embeddings: max_seq_length leaving no room for a word": (
        [],
        sentence_model(max_seq_length=2),
        r"^max_seq_length must be an int of at least 3 positions \(<S>, a word, "
        r"</S>\), got 2$",
    ),
    "sentence embeddings: a pooling mode that reads the boundary positions": (
        [],
        sentence_model(pooling_mode="cls"),
        r"^pooling_mode must be one of \('mean', 'max'\) \(over the words\), "
        r"got 'cls'$",
    ),
}


@pytest.mark.parametrize("name", API_CASES)
def test_api_refuses_with_a_clear_value_error(name, workspace):
    check_api_refusal(API_CASES[name], workspace)
