"""The sentence-transformers recipe given options that leave no word, read the boundary positions or would allocate
more than a forward may hold, and folders whose files are damaged before transformers or sentence-transformers reads
them: a `ValueError` naming the problem (the argument and its range, or the file and where in it).

Where transformers or sentence-transformers parse a file before any code of hf_elmo runs, the row is an expected
failure (strict: it starts to pass, and says so, once they name the file):
- `AutoTokenizer.from_pretrained(folder)`, also with `trust_remote_code=True` while hf_elmo is imported, reads
  tokenizer_config.json in `get_tokenizer_config` (json.load) to choose the tokenizer class; before that only
  `ElmoConfig.from_dict` runs, given config.json's values, not the folder.
- `SentenceTransformer(folder)` reads modules.json (json.load in `_load_config_modules`) to learn its modules' classes.
- `AutoModel.from_pretrained(folder)` of a config.json with model_type "bert" builds transformers' `BertModel`; only
  with `trust_remote_code=True` does the folder's own `ElmoConfig` see it.
"""

import json

import pytest
from hostile import check_api_refusal, sentence_model, write
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoTokenizer

from hf_elmo import ElmoConfig, ElmoTokenizer
from hf_elmo.features.sentence_embeddings import elmo_sentence_transformer, max_positions

ALLENNLP_LARGEST = "729,444"  # see test_the_largest_max_seq_length_follows_from_the_model


def sentence_folder(root):
    """`S`: the sentence-transformers folder that a model of `elmo_sentence_transformer` on `M` saves."""
    elmo_sentence_transformer(root / "M").save(str(root / "S"))


def edit_config(folder, **changes):
    def edit(root):
        config = json.loads((root / folder / "config.json").read_text())
        (root / folder / "config.json").write_text(json.dumps({**config, **changes}))

    return edit


def reload(**options):
    return lambda root: SentenceTransformer(str(root / "S"), **options)


def set_max_seq_length(value):
    def call(root):
        elmo_sentence_transformer(root / "M").max_seq_length = value

    return call


NOT_JSON = r"tokenizer_config\.json is not valid JSON \(line 1, column 2: "
EMPTY = r"tokenizer_config\.json is not valid JSON \(line 1, column 1: Expecting value\)"
NOT_ELMO = r"S: config\.json: The configuration has model_type 'bert', not 'elmo': it is not an ELMo model\.$"
BEFORE_US = pytest.mark.xfail(strict=True, reason="the file is parsed before any code of hf_elmo runs (docstring)")


def row(name, setup, call, message, marks=()):
    return pytest.param((setup, call, message), id=name, marks=marks)


API_CASES = [
    # --- options ---
    row(
        "max_seq_length leaving no room for a word",
        [],
        sentence_model(max_seq_length=2),
        r"^max_seq_length must be an int from 3 \(<S>, a word, </S>\) to " + ALLENNLP_LARGEST + r" positions \(more "
        r"would make a tensor of over 2\*\*31 elements in this model's forward\), got 2$",
    ),
    row(
        "max_seq_length 10**9",
        [],
        sentence_model(max_seq_length=10**9),
        r"^max_seq_length must be an int from 3 .* to " + ALLENNLP_LARGEST + r" positions .*, got 1000000000$",
    ),
    row("max_seq_length 1.5", [], sentence_model(max_seq_length=1.5), r"^max_seq_length must be an int .*, got 1\.5$"),
    row("max_seq_length '512'", [], sentence_model(max_seq_length="512"), r"^max_seq_length must be .*, got '512'$"),
    row("max_seq_length True", [], sentence_model(max_seq_length=True), r"^max_seq_length must be .*, got True$"),
    row(
        "max_seq_length set to 10**9 after construction",
        [],
        set_max_seq_length(10**9),
        r"^max_seq_length must be an int from 3 .* to " + ALLENNLP_LARGEST + r" positions .*, got 1000000000$",
    ),
    row(
        "a pooling mode that reads the boundary positions",
        [],
        sentence_model(pooling_mode="cls"),
        r"^pooling_mode must be one of \('mean', 'max'\) \(over the words\), got 'cls'$",
    ),
    # --- an ELMo folder (M) ---
    row(
        "ElmoTokenizer.from_pretrained: tokenizer_config.json not JSON",
        [write("M/tokenizer_config.json", "{bad")],
        lambda root: ElmoTokenizer.from_pretrained(root / "M"),
        r"M: " + NOT_JSON,
    ),
    row(
        "ElmoTokenizer.from_pretrained: tokenizer_config.json empty",
        [write("M/tokenizer_config.json", "")],
        lambda root: ElmoTokenizer.from_pretrained(root / "M"),
        r"M: " + EMPTY,
    ),
    row(
        "elmo_sentence_transformer: tokenizer_config.json not JSON",
        [write("M/tokenizer_config.json", "{bad")],
        sentence_model(),
        r"M: " + NOT_JSON,
    ),
    row(
        "elmo_sentence_transformer: tokenizer_config.json empty",
        [write("M/tokenizer_config.json", "")],
        sentence_model(),
        r"M: " + EMPTY,
    ),
    row(
        "AutoTokenizer: tokenizer_config.json not JSON",
        [write("M/tokenizer_config.json", "{bad")],
        lambda root: AutoTokenizer.from_pretrained(root / "M"),
        r"M: " + NOT_JSON,
        BEFORE_US,
    ),
    row(
        "AutoTokenizer: tokenizer_config.json empty",
        [write("M/tokenizer_config.json", "")],
        lambda root: AutoTokenizer.from_pretrained(root / "M"),
        r"M: " + EMPTY,
        BEFORE_US,
    ),
    row(
        "AutoTokenizer with trust_remote_code: tokenizer_config.json not JSON",
        [write("M/tokenizer_config.json", "{bad")],
        lambda root: AutoTokenizer.from_pretrained(root / "M", trust_remote_code=True),
        r"M: " + NOT_JSON,
        BEFORE_US,
    ),
    # --- a sentence-transformers folder (S) ---
    row(
        "SentenceTransformer: tokenizer_config.json not JSON",
        [sentence_folder, write("S/tokenizer_config.json", "{bad")],
        reload(trust_remote_code=True),
        r"S: " + NOT_JSON,
    ),
    row(
        "SentenceTransformer: tokenizer_config.json empty",
        [sentence_folder, write("S/tokenizer_config.json", "")],
        reload(trust_remote_code=True),
        r"S: " + EMPTY,
    ),
    row(
        "SentenceTransformer: model_type bert over ELMo's weights",
        [sentence_folder, edit_config("S", model_type="bert")],
        reload(trust_remote_code=True),
        NOT_ELMO,
    ),
    row(
        "SentenceTransformer: sentence_bert_config.json not JSON",
        [sentence_folder, write("S/sentence_bert_config.json", "{bad")],
        reload(trust_remote_code=True),
        r"S/sentence_bert_config\.json: not valid JSON \(line 1, column 2: ",
    ),
    row(
        "SentenceTransformer: the pooling module's config.json not JSON",
        [sentence_folder, write("S/1_ElmoWordPooling/config.json", "{bad")],
        reload(trust_remote_code=True),
        r"S/1_ElmoWordPooling/config\.json: not valid JSON \(line 1, column 2: ",
    ),
    row(
        "SentenceTransformer: the pooling module's config.json a list",
        [sentence_folder, write("S/1_ElmoWordPooling/config.json", "[]")],
        reload(trust_remote_code=True),
        r"S/1_ElmoWordPooling/config\.json: expected a JSON object \(the options of a sentence-transformers pooling "
        r"module\), got list",
    ),
    row(
        "SentenceTransformer: sentence_bert_config.json max_seq_length 10**9",
        [sentence_folder, write("S/sentence_bert_config.json", '{"max_seq_length": 1000000000}')],
        reload(trust_remote_code=True),
        r"S/sentence_bert_config\.json: max_seq_length must be an int from 3 .* to " + ALLENNLP_LARGEST,
    ),
    row(
        "SentenceTransformer: without trust_remote_code",
        [sentence_folder, write("S/tokenizer_config.json", "{bad")],
        reload(),
        r"references the module class 'hf_elmo\.features\.sentence_embeddings\.ElmoTransformer'.*\n"
        r"Please pass the argument `trust_remote_code=True`",
    ),
    row(
        "AutoModel with trust_remote_code: model_type bert over ELMo's weights",
        [sentence_folder, edit_config("S", model_type="bert")],
        lambda root: AutoModel.from_pretrained(root / "S", trust_remote_code=True),
        NOT_ELMO,
    ),
    row(
        "SentenceTransformer: modules.json not JSON",
        [sentence_folder, write("S/modules.json", "[{bad")],
        reload(trust_remote_code=True),
        r"S/modules\.json",
        BEFORE_US,
    ),
    row(
        "AutoModel: model_type bert over ELMo's weights",
        [sentence_folder, edit_config("S", model_type="bert")],
        lambda root: AutoModel.from_pretrained(root / "S"),
        NOT_ELMO,
        BEFORE_US,
    ),
]


@pytest.mark.parametrize("case", API_CASES)
def test_api_refuses_with_a_clear_value_error(case, workspace):
    check_api_refusal(case, workspace)


def test_the_largest_max_seq_length_follows_from_the_model(workspace):
    """The largest tensor per position of the original biLM is its widest filter's window products, 1,024 filters x
    (50 - 7 + 1) windows = 45,056 elements: 2**31 // 45,056 = 47,662 positions. The AllenNLP test model's (options.json)
    is its widest filter's too, 64 filters x (50 - 5 + 1) windows = 2,944 elements: 2**31 // 2,944 = 729,444."""
    assert max_positions(ElmoConfig.from_preset("original")) == 47_662
    largest = int(ALLENNLP_LARGEST.replace(",", ""))
    assert max_positions(ElmoConfig.from_pretrained(workspace / "M")) == largest
    sentences = elmo_sentence_transformer(workspace / "M", max_seq_length=largest)
    assert sentences.max_seq_length == largest
    with pytest.raises(ValueError, match=r"^max_seq_length must be an int from 3 .*, got 729445$"):
        sentences.max_seq_length = largest + 1
    assert sentences.max_seq_length == largest
