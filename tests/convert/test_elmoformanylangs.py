"""ELMoForManyLangs (HIT-SCIR) conversion, against a small model in their folder layout (legacy `torch.save` pickles
tagged `cuda:0`, `char.dic` with a lone-id U+3000 line, a model configuration found through the basename fallback)
with random weights, `tests/fixtures/elmoformanylangs/`. Two truths: the outputs of HIT-SCIR's own `Embedder` on
that model (float32, stored with the model; its README says how they were made), and a float64 NumPy
implementation of their model written from the format description, reading their state dicts and building their
character ids (with `<eow>` first and `<bow>` last, as their batcher does): neither shares code with the converter
or the model, and they agree with each other."""

import json
import re
import shutil
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import torch
from conftest import FIXTURES
from datasets import Dataset
from reference_elmo import lstm_direction, sigmoid
from transformers import (
    AutoModel,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    pipeline,
)

from hf_elmo import ElmoTokenizer
from hf_elmo.commands.cli import main as cli_main
from hf_elmo.features.task_data import DataCollatorForElmo, ElmoLayerCache, tokenize_and_align_labels

FIXTURE = FIXTURES / "elmoformanylangs"
MODEL_DIR = FIXTURE / "zz.model"
CONFIG_NAME = "cnn_4_5_8_16_sample.json"
CONFIG = json.loads((MODEL_DIR / CONFIG_NAME).read_text())
SENTENCES = json.loads((FIXTURE / "sentences.json").read_text(encoding="utf-8"))
IDEOGRAPHIC_SPACE = "\u3000"


# --- their model in NumPy (from the format description) ------------------------------------------


def read_dic(path):
    entries = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.strip().split("\t")
        token, index = fields if len(fields) == 2 else ("\u3000", fields[0])
        entries[token] = int(index)
    return entries


def their_layers(folder, words):
    """`(3, n_words, 2P)` float64 outputs of one sentence, as their Embedder computes them (boundaries removed)."""
    chars, vocab = read_dic(folder / "char.dic"), read_dic(folder / "word.dic")
    embedder = {k: v.double().numpy() for k, v in torch.load(folder / "token_embedder.pkl", map_location="cpu").items()}
    encoder = {k: v.double().numpy() for k, v in torch.load(folder / "encoder.pkl", map_location="cpu").items()}
    tok, enc = CONFIG["token_embedder"], CONFIG["encoder"]
    tokens = ["<bos>", *[w[:48] for w in words], "<eos>"]
    char_ids = np.full((len(tokens), 50), chars["<pad>"])
    for row, token in zip(char_ids, tokens):
        content = [chars[token]] if token in ("<bos>", "<eos>") else [chars.get(c, chars["<oov>"]) for c in token]
        row[0], row[1 : len(content) + 1], row[len(content) + 1] = chars["<eow>"], content, chars["<bow>"]
    word_ids = [vocab.get(token, vocab["<oov>"]) for token in tokens]

    relu = lambda x: np.maximum(x, 0.0)  # noqa: E731
    embedded = []
    for ids, word_id in zip(char_ids, word_ids):
        x = embedder["char_emb_layer.embedding.weight"][ids]  # (50, e)
        features = []
        for k, (width, _count) in enumerate(tok["filters"]):
            kernel, bias = embedder[f"convolutions.{k}.weight"], embedder[f"convolutions.{k}.bias"]
            conv = np.stack([np.einsum("we,new->n", x[s : s + width], kernel) for s in range(50 - width + 1)]) + bias
            features.append(relu(conv.max(axis=0)))
        h = np.concatenate(features)
        for j in range(tok["n_highway"]):
            both = embedder[f"highways._layers.{j}.weight"] @ h + embedder[f"highways._layers.{j}.bias"]
            gate = sigmoid(both[len(h) :])
            h = gate * h + (1 - gate) * relu(both[: len(h)])
        h = np.concatenate([embedder["word_emb_layer.embedding.weight"][word_id], h])
        embedded.append(embedder["projection.weight"] @ h + embedder["projection.bias"])
    x = np.stack(embedded)
    cell = SimpleNamespace(
        cell_dim=enc["dim"],
        projection_dim=enc["projection_dim"],
        cell_clip=enc["cell_clip"],
        proj_clip=enc["proj_clip"],
        forget_bias=0.0,  # AllenNLP's LSTM adds none at run time
    )
    P, D = enc["projection_dim"], enc["dim"]
    layers, forward_in, backward_in = [np.concatenate([x, x], axis=-1)], x, x
    for layer in range(enc["n_layers"]):
        fwd, *_ = lstm_direction(encoder, cell, f"forward_layer_{layer}", forward_in, np.zeros(P), np.zeros(D), False)
        bwd, *_ = lstm_direction(encoder, cell, f"backward_layer_{layer}", backward_in, np.zeros(P), np.zeros(D), True)
        if layer > 0:
            fwd, bwd = fwd + forward_in, bwd + backward_in
        forward_in, backward_in = fwd, bwd
        layers.append(np.concatenate([fwd, bwd], axis=-1))
    return np.stack(layers)[:, 1:-1]


# --- their Embedder's numbers (stored with the model) --------------------------------------------

OUTPUT_LAYERS = (-1, 0, 1, 2)


def their_embedder_outputs():
    """HIT-SCIR's `sents2elmo` on `SENTENCES` in one batch: `{(output_layer, sentence): (n_words, 2P)}` from fresh
    `Embedder`s (-1, their mean of the layers, fails on the empty sentence), and `{sentence: (3, n_words, 2P)}`
    from a second call on one of them, which starts each row from the state the first call left it."""
    with np.load(FIXTURE / "sents2elmo.npz") as stored:
        arrays = dict(stored)
    first = {
        (layer, k): arrays.pop(f"output_layer_{layer}_sentence_{k}")
        for layer in OUTPUT_LAYERS
        for k, words in enumerate(SENTENCES)
        if words or layer != -1
    }
    second = {k: arrays.pop(f"second_call_sentence_{k}") for k in range(len(SENTENCES))}
    assert not arrays, f"stored but not checked: {sorted(arrays)}"
    return first, second


def assert_their_numbers(ours, theirs):
    """`ours` equals their float32 `theirs` (`(n_words, 2P)` or layers of it) to float32 rounding: every value is
    the end of a few hundred rounded float32 products and sums (character CNN, highways, projection, then up to 8
    LSTM steps of 16-term products per layer, clipped), each off by at most 2^-24 relative, on their side and, in
    float32, on ours: within 1e-5 of each layer's largest value (docs/testing.md), never relative to one value."""
    assert ours.shape == theirs.shape
    layers = lambda a: a if a.ndim == 3 else a[None]  # noqa: E731
    for mine, expected in zip(layers(ours), layers(theirs)):
        assert np.abs(mine - expected).max(initial=0) <= 1e-5 * np.abs(expected).max(initial=0)


# --- tests ---------------------------------------------------------------------------------------


def convert_args(folder, output):
    return ["convert", "--format", "elmoformanylangs", "--model-dir", str(folder), "--output-dir", str(output)]


@pytest.fixture(scope="module")
def their_folder():
    return MODEL_DIR


@pytest.fixture(scope="module")
def converted(their_folder, tmp_path_factory):
    output = tmp_path_factory.mktemp("converted") / "elmo-zz"
    assert cli_main(convert_args(their_folder, output)) == 0
    return output


def test_the_stand_in_needs_the_cpu_map_location(their_folder):
    # Its storages are tagged cuda:0, as in the released files: without map_location they go back to the GPU, which
    # fails on a machine without one (the converter passes map_location="cpu").
    if torch.cuda.is_available():
        state = torch.load(their_folder / "encoder.pkl", weights_only=True)
        assert {tensor.device for tensor in state.values()} == {torch.device("cuda", 0)}
    else:
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(their_folder / "encoder.pkl", weights_only=True)


def test_hand_derived_ids(converted, their_folder):
    tokenizer = AutoTokenizer.from_pretrained(converted)
    chars = read_dic(their_folder / "char.dic")
    shifted = lambda *names: [chars[n] + 1 for n in names]  # noqa: E731  (ids in input_ids are char.dic ids + 1)
    bow, eow, pad, oov = shifted("<bow>", "<eow>", "<pad>", "<oov>")
    enc = tokenizer(
        [["cat", "<bos>", "zé", "ab" * 30, IDEOGRAPHIC_SPACE]], is_split_into_words=True, return_tensors="np"
    )
    rows = enc["input_ids"][0]
    assert rows.shape == (7, 50)
    assert rows[0].tolist() == [bow, *shifted("<bos>"), eow] + [pad] * 47
    assert rows[1].tolist() == [bow, *shifted("c", "a", "t"), eow] + [pad] * 45
    assert rows[2].tolist() == rows[0].tolist()  # a literal <bos> word is the boundary
    assert rows[3].tolist() == [bow, oov, oov, eow] + [pad] * 46  # neither z nor é is in char.dic
    assert rows[4].tolist() == [bow] + shifted("a", "b") * 24 + [eow]  # cut to 48 characters
    assert rows[5].tolist() == [bow, *shifted(IDEOGRAPHIC_SPACE), eow] + [pad] * 47  # the lone-id line's entry
    assert rows[6].tolist() == [bow, *shifted("<eos>"), eow] + [pad] * 47
    # word.dic: <oov> 0, <bos> 1, <eos> 2, <pad> 3, then the words; the cut word is looked up
    assert enc["input_word_ids"][0].tolist() == [1, 5, 1, 0, 8, 0, 2]
    padded = tokenizer([["cat"], []], is_split_into_words=True, padding=True, return_tensors="np")
    assert padded["input_word_ids"].tolist() == [[1, 5, 2], [1, 2, 3]]
    assert not padded["input_ids"][1, 2].any()


def test_converted_model_matches_their_computation(converted, their_folder):
    model = AutoModel.from_pretrained(converted).double().eval()
    tokenizer = AutoTokenizer.from_pretrained(converted)
    assert model.config.char_vocabulary and model.config.input_word_dim == 5 and model.config.n_characters == 35
    batch = tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        layers = torch.stack(model(**batch, output_hidden_states=True).hidden_states)
    clipped = 0
    for k, words in enumerate(SENTENCES):
        expected = their_layers(their_folder, words)
        assert expected.shape == (3, len(words), 16)
        np.testing.assert_allclose(layers[:, k, 1 : len(words) + 1].numpy(), expected, rtol=0, atol=1e-10)
        clipped += int((np.abs(expected[1]) >= CONFIG["encoder"]["proj_clip"] - 1e-12).sum())
    assert 0 < clipped < layers[1].numel() / 2, "the projection clip should be exercised, not everywhere"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_converted_model_gives_their_embedders_numbers(converted, dtype):
    first, second = their_embedder_outputs()
    model = AutoModel.from_pretrained(converted).to(dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(converted)
    batch = tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True, use_cache=True)
        again = model(**batch, output_hidden_states=True, state=out.state)
    layers, carried = (torch.stack(o.hidden_states).double().numpy() for o in (out, again))
    for (output_layer, k), theirs in first.items():
        words = layers[:, k, 1 : len(SENTENCES[k]) + 1]
        assert_their_numbers(words.mean(axis=0) if output_layer == -1 else words[output_layer], theirs)
    for k, theirs in second.items():
        assert_their_numbers(carried[:, k, 1 : len(SENTENCES[k]) + 1], theirs)


def test_embed_average_and_carried_state_give_their_embedders_numbers(converted, tmp_path):
    """`embed --average` is their `output_layer=-1`; `--carry-state` over the sentences twice, one batch each time,
    is their second call. Lines are split on whitespace, so the sentence with U+3000 inside a word is left out (a
    batch's rows are computed independently, in theirs too)."""
    first, second = their_embedder_outputs()
    kept = [k for k, words in enumerate(SENTENCES) if all(len(word.split()) == 1 for word in words)]
    assert len(kept) == len(SENTENCES) - 1
    (tmp_path / "in.txt").write_text("".join(" ".join(SENTENCES[k]) + "\n" for k in kept * 2), encoding="utf-8")
    embed = ["embed", str(tmp_path / "in.txt"), "--model", str(converted), "--quiet"]
    assert cli_main([*embed, str(tmp_path / "average.hdf5"), "--average"]) == 0
    assert (
        cli_main([*embed, str(tmp_path / "carried.hdf5"), "--all", "--carry-state", "--batch-size", str(len(kept))])
        == 0
    )
    with h5py.File(tmp_path / "average.hdf5", "r") as average, h5py.File(tmp_path / "carried.hdf5", "r") as carried:
        for line, k in enumerate(kept):
            if SENTENCES[k]:
                assert_their_numbers(average[str(line)][...], first[-1, k])
            assert_their_numbers(carried[str(len(kept) + line)][...], second[k])


def test_numpy_reference_gives_their_embedders_numbers(their_folder):
    first, _ = their_embedder_outputs()
    layers = [their_layers(their_folder, words) for words in SENTENCES]
    for (output_layer, k), theirs in first.items():
        assert_their_numbers(layers[k].mean(axis=0) if output_layer == -1 else layers[k][output_layer], theirs)


def test_embed_reads_word_ids_too(converted, their_folder, tmp_path):
    (tmp_path / "in.txt").write_text("the cat sat\n日本語 😀\n", encoding="utf-8")
    output = tmp_path / "out.hdf5"
    assert (
        cli_main(
            [
                "embed",
                str(tmp_path / "in.txt"),
                str(output),
                "--model",
                str(converted),
                "--all",
                "--dtype",
                "float64",
                "--quiet",
            ]
        )
        == 0
    )
    with h5py.File(output, "r") as f:
        for i, words in enumerate([["the", "cat", "sat"], ["日本語", "😀"]]):
            np.testing.assert_allclose(f[str(i)][...], their_layers(their_folder, words), rtol=0, atol=1e-10)


def test_task_heads_on_the_converted_model(converted, their_folder, tmp_path):
    """The heads read the character vocabulary's rows and the word ids: token logits are the classified mix of
    their layers, also through the layer cache and the collator, in a saved tagger's pipeline and for sentences."""
    tokenizer = AutoTokenizer.from_pretrained(converted)
    torch.manual_seed(0)
    tagger = AutoModelForTokenClassification.from_pretrained(converted, num_labels=3).double().eval()
    mix = tagger.task_encoder.scalar_mixes["input"]
    with torch.no_grad():
        mix.scalar_parameters.copy_(torch.tensor([0.5, -1.0, 0.25]))
        mix.gamma.fill_(1.5)
        tagger.classifier.weight.normal_()
    sentences = SENTENCES[:3]
    tags = [[k % 3 for k in range(len(words))] for words in sentences]
    encoded = tokenize_and_align_labels(tokenizer, sentences, tags, padding=True, return_tensors="pt")
    assert "input_word_ids" in encoded
    with torch.no_grad():
        out = tagger(**encoded)
    weights = torch.softmax(mix.scalar_parameters.detach(), 0).numpy() * 1.5
    weight, bias = tagger.classifier.weight.detach().numpy(), tagger.classifier.bias.detach().numpy()
    for row, words in enumerate(sentences):
        mixed = np.einsum("k,knd->nd", weights, their_layers(their_folder, words))
        np.testing.assert_allclose(out.logits[row, 1 : len(words) + 1].numpy(), mixed @ weight.T + bias, atol=1e-9)
    assert torch.isfinite(out.loss)

    features = Dataset.from_dict({k: [v[i] for i in range(len(sentences))] for k, v in encoded.items()})
    features = features.map(ElmoLayerCache(tagger), batched=True, batch_size=2).with_format("torch")
    batch = DataCollatorForElmo(tokenizer)([features[i] for i in range(len(sentences))])
    with torch.no_grad():
        cached = tagger(**{k: v.double() if k == "elmo_hidden_states" else v for k, v in batch.items()}).logits
    torch.testing.assert_close(cached, out.logits, rtol=0, atol=1e-6)

    tagger.save_pretrained(tmp_path / "tagger")
    tokenizer.save_pretrained(tmp_path / "tagger")
    tagged = pipeline("elmo-token-classification", model=str(tmp_path / "tagger"))(" ".join(sentences[0]))
    predicted = out.logits[0, 1 : len(sentences[0]) + 1].argmax(-1).tolist()
    assert [(e["word"], e["entity"]) for e in tagged] == [(w, f"LABEL_{t}") for w, t in zip(sentences[0], predicted)]
    classifier = AutoModelForSequenceClassification.from_pretrained(converted, num_labels=2).eval()
    batch = tokenizer(sentences, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.isfinite(classifier(**batch).logits).all()
    unframed = tokenizer(
        sentences, is_split_into_words=True, add_special_tokens=False, padding=True, return_tensors="pt"
    )
    with pytest.raises(ValueError, match="framed by the <S> and </S> rows"):
        tagger(**unframed)
    with pytest.raises(ValueError, match="word vectors are found from the UTF-8 byte rows"):
        AutoModelForTokenClassification.from_pretrained(
            converted, num_labels=3, word_vectors_size=4, word_vectors_dim=2
        )


def test_default_model_config_is_used_when_the_folder_lacks_it(their_folder, tmp_path, capsys):
    folder = tmp_path / "zz.model"
    shutil.copytree(their_folder, folder)
    (folder / CONFIG_NAME).unlink()
    training = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**training, "config_path": "/x/cnn_50_100_512_4096_sample.json"}))
    args = convert_args(folder, tmp_path / "out")
    assert cli_main(args) == 2
    # The released default (char_dim 50) does not fit this small model: the error says where the config came from.
    err = capsys.readouterr().err.strip()
    assert re.search(
        r"token_embedder\.pkl: keys do not match the model configuration \(the built-in "
        r"cnn_50_100_512_4096_sample\.json; .*--model-config\): missing \['convolutions\.3\.bias'",
        err,
    ), err
    assert cli_main([*args, "--model-config", str(their_folder / CONFIG_NAME)]) == 0


def _edit_file(name, edit):
    def damage(folder):
        path = folder / name
        path.write_bytes(edit(path.read_bytes()))

    return damage


def _edit_state(name, edit):
    def damage(folder):
        state = torch.load(folder / name, map_location="cpu", weights_only=True)
        edit(state)
        torch.save(state, folder / name)

    return damage


DAMAGES = {
    "truncated pickle": (
        _edit_file("encoder.pkl", lambda b: b[: len(b) // 2]),
        r"encoder\.pkl: not a readable torch checkpoint",
    ),
    "not a pickle": (
        _edit_file("token_embedder.pkl", lambda b: b"PK\x03\x04garbage"),
        r"token_embedder\.pkl: not a readable",
    ),
    "bad training config": (_edit_file("config.json", lambda b: b[:-3]), r"config\.json: not valid JSON"),
    "bad model config": (
        _edit_file(CONFIG_NAME, lambda b: b.replace(b'"elmo"', b'"lstm"')),
        r"encoder\.name is 'lstm'; only 'elmo' models are supported",
    ),
    "blank line in char.dic": (_edit_file("char.dic", lambda b: b"\n" + b), r"char\.dic: line 1 is ''"),
    "id past the table": (
        _edit_file("char.dic", lambda b: b + "Ω\t99\n".encode()),
        r"char\.dic: ids must be in \[0, 33\] \(rows of the embedding table\), found \[0, 99\]",
    ),
    "missing special": (
        _edit_file("word.dic", lambda b: b.replace(b"<pad>\t3\n", b"")),
        r"word\.dic: lacks the special entries \['<pad>'\]",
    ),
    "missing key": (
        _edit_state("encoder.pkl", lambda s: s.pop("backward_layer_1.state_projection.weight")),
        r"encoder\.pkl: keys do not match .* missing \['backward_layer_1\.state_projection\.weight'\]",
    ),
    "wrong shape": (
        _edit_state("token_embedder.pkl", lambda s: s.update({"projection.bias": torch.zeros(7)})),
        r"'projection\.bias' has shape \(7,\), expected \(8,\)",
    ),
    "not finite": (
        _edit_state("token_embedder.pkl", lambda s: s["convolutions.1.bias"].__setitem__(0, float("nan"))),
        r"'convolutions\.1\.bias' must hold finite floats",
    ),
    "missing file": (lambda folder: (folder / "word.dic").unlink(), r"word\.dic: no such file"),
}


@pytest.mark.parametrize("case", DAMAGES)
def test_damaged_folders_give_one_line_and_leave_nothing(case, their_folder, tmp_path, capsys):
    damage, message = DAMAGES[case]
    folder = tmp_path / "zz.model"
    shutil.copytree(their_folder, folder)
    damage(folder)
    before = sorted(tmp_path.iterdir())
    args = convert_args(folder, tmp_path / "out")
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and re.search(message, err), err
    assert sorted(tmp_path.iterdir()) == before


def test_format_arguments_are_checked(tmp_path, capsys):
    assert (
        cli_main(
            ["convert", "--format", "elmoformanylangs", "--options", "o.json", "--output-dir", str(tmp_path / "o")]
        )
        == 2
    )
    assert "takes --model-dir" in capsys.readouterr().err
    assert cli_main(["convert", "--model-dir", str(tmp_path), "--output-dir", str(tmp_path / "o")]) == 2
    assert "--format original takes --options and --weights" in capsys.readouterr().err


# --- the tokenizer's character-vocabulary mode on its own ----------------------------------------

SMALL_CHARS = {c: i + 1 for i, c in enumerate(["a", "b", "<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>"])}
SMALL_WORDS = {"<oov>": 0, "<bos>": 1, "<eos>": 2, "<pad>": 3, "ab": 4}


def test_vocabulary_tokenizer_pads_decodes_and_round_trips(tmp_path):
    tokenizer = ElmoTokenizer(char_vocab=SMALL_CHARS, input_word_vocab=SMALL_WORDS)
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token_id, tokenizer.vocab_size) == (
        "<bos>",
        "<eos>",
        0,
        9,
    )
    examples = [tokenizer(words, is_split_into_words=True) for words in (["ab", "c"], ["ab"])]
    batch = tokenizer.pad(examples, return_tensors="np")
    assert batch["input_word_ids"].tolist() == [[1, 4, 0, 2], [1, 4, 2, 3]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch.word_ids(1) == [None, 0, None, None]  # boundary rows recognised without the encoding's spans
    assert tokenizer.decode(batch["input_ids"][0]) == "<bos> ab \ufffd <eos>"  # c is not in the vocabulary
    assert tokenizer.decode(batch["input_ids"][1], skip_special_tokens=True) == "ab"
    tokenizer.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again.char_vocabulary.chars == SMALL_CHARS and again.char_vocabulary.words == SMALL_WORDS
    assert again.model_input_names == ["input_ids", "attention_mask", "input_word_ids"]
    assert (again.pad(examples, return_tensors="np")["input_ids"] == batch["input_ids"]).all()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(char_vocab={"a": 1}), r"character vocabulary lacks the special entries \['<bow>', '<eow>', '<pad>'"),
        (dict(char_vocab={**SMALL_CHARS, "a": 0}), r"entry 'a' -> 0; expected a str -> an int >= 1"),
        (dict(char_vocab={**SMALL_CHARS, "a": "1"}), r"entry 'a' -> '1'"),
        (
            dict(char_vocab=SMALL_CHARS, input_word_vocab={"<oov>": 0}),
            r"word vocabulary lacks the special entries \['<pad>'",
        ),
        (dict(input_word_vocab=SMALL_WORDS), "input_word_vocab needs a char_vocab"),
        (dict(char_vocab_file="/nonexistent/char_vocab.json"), r"char_vocab\.json: cannot read the vocabulary"),
    ],
)
def test_bad_vocabularies_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ElmoTokenizer(**kwargs)


def test_the_converted_folder_card_names_its_source(converted, their_folder):
    card = (converted / "README.md").read_text(encoding="utf-8")
    assert (
        f"* Converted by `hf-elmo convert --format elmoformanylangs` from the ELMoForManyLangs model "
        f"`{their_folder.name}`.\n" in card
    )
