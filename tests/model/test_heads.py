"""ElmoForSequenceClassification / ElmoForTokenClassification: initialisation, the computation against float64
recomputations, losses, label handling, word vectors, the frozen-biLM cache and training with Trainer."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import (
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    Trainer,
    TrainingArguments,
    set_seed,
)

from hf_elmo import ElmoConfig, ElmoForSequenceClassification, ElmoForTokenClassification, ElmoModel, ElmoTokenizer
from hf_elmo.features.task_data import DataCollatorForElmo, ElmoLayerCache, tokenize_and_align_labels

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = [["The", "cat", "sat", "on", "the", "mat", "."], ["Hi"], ["Über", "naïve", "words", "here"], []]


def tiny_config(**overrides):
    values = dict(
        char_embedding_dim=4,
        filters=[[1, 4], [2, 6], [3, 8]],
        n_highway=1,
        cell_dim=12,
        projection_dim=6,
        num_layers=2,
        dropout=0.0,
        num_labels=5,
    )
    values.update(overrides)
    return ElmoConfig(**values)


def tiny_model(cls, **overrides):
    """A float64 head in eval mode whose every parameter is random (ScalarMix weights included)."""
    model = cls(tiny_config(**overrides)).double().eval()
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn_like(param) / param.shape[-1] ** 0.5)
    return model


def batch(sentences=SENTENCES):
    return ElmoTokenizer()(sentences, is_split_into_words=True, padding=True, return_tensors="pt")


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def bilm_layers(model, encoded):
    """`(B, T, L + 1, 2P)` float64 NumPy layers of the head's own biLM."""
    with torch.no_grad():
        return torch.stack(model.elmo(**encoded, output_hidden_states=True).hidden_states, dim=2).numpy()


def mixed_elmo(model, layers, place="input"):
    mix = model.task_encoder.scalar_mixes[place]
    s = softmax(mix.scalar_parameters.detach().numpy())
    return mix.gamma.item() * np.einsum("k,btkd->btd", s, layers[:, :, model.task_encoder.mixed_layers])


@pytest.fixture
def single_thread():
    # The tiny models train fastest on one thread, and much slower on a CPU shared with other processes.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- initialisation and freezing --------------------------------------------------------------------------------


def test_from_pretrained_initialises_the_new_parameters(converted_dirs):
    folder = converted_dirs["allennlp"]
    bilm = ElmoModel.from_pretrained(folder)
    model = AutoModelForTokenClassification.from_pretrained(
        folder, num_labels=17, task_encoder_hidden_size=7, elmo_placement=["input", "output"]
    )
    assert isinstance(model, ElmoForTokenClassification) and model.classifier.out_features == 17
    for mix in model.task_encoder.scalar_mixes.values():
        assert torch.equal(mix.scalar_parameters.detach(), torch.zeros(3)) and torch.equal(
            mix.gamma.detach(), torch.ones(1)
        )
    bound = 1 / 7**0.5
    for name, param in model.task_encoder.lstm.named_parameters():
        assert param.abs().max() <= bound and param.std() > bound / 4, name  # PyTorch's uniform(-bound, bound)
    assert torch.equal(model.classifier.bias.detach(), torch.zeros(17))
    assert 0.005 < model.classifier.weight.std() < 0.05
    assert all(torch.equal(a, b) for a, b in zip(model.elmo.state_dict().values(), bilm.state_dict().values()))
    assert not any(p.requires_grad for p in model.elmo.parameters())
    # Initial values other than the defaults, which memory garbage cannot match by chance.
    model = AutoModelForSequenceClassification.from_pretrained(
        folder, num_labels=3, scalar_mix_weights=[1.5, 0.0, -2.0], scalar_mix_gamma=0.25, scalar_mix_trainable=False
    )
    mix = model.task_encoder.scalar_mixes["input"]
    assert mix.scalar_parameters.tolist() == [1.5, 0.0, -2.0] and mix.gamma.tolist() == [0.25]
    assert not mix.scalar_parameters.requires_grad and not mix.gamma.requires_grad


def test_frozen_bilm_stays_in_eval_mode_without_gradients():
    model = ElmoForTokenClassification(tiny_config(dropout=0.5))
    model.train()
    assert model.training and model.task_encoder.training and not model.elmo.training
    labels = torch.full(batch()["attention_mask"].shape, -100)
    labels[0, 1:8] = 0
    model(**batch(), labels=labels).loss.backward()
    assert all(p.grad is None for p in model.elmo.parameters())
    tuned = ElmoForTokenClassification(tiny_config(dropout=0.5, freeze_elmo=False)).train()
    assert tuned.elmo.training
    tuned(**batch()).logits.square().sum().backward()
    assert all(p.grad is not None for p in tuned.elmo.parameters())


# --- the computation -------------------------------------------------------------------------------------------


def test_token_logits_are_the_classified_scalar_mix_of_each_word():
    model = tiny_model(ElmoForTokenClassification)
    encoded = batch()
    with torch.no_grad():
        logits = model(**encoded).logits.numpy()
    mixed = mixed_elmo(model, bilm_layers(model, encoded))
    weight, bias = model.classifier.weight.detach().numpy(), model.classifier.bias.detach().numpy()
    assert logits.shape == (*encoded["attention_mask"].shape, 5)
    for row, sentence in enumerate(SENTENCES):
        n = len(sentence)
        np.testing.assert_allclose(logits[row, 1 : n + 1], mixed[row, 1 : n + 1] @ weight.T + bias, rtol=0, atol=1e-12)
        assert not logits[row, 0].any() and not logits[row, n + 1 :].any(), "boundaries and padding get 0"


@pytest.mark.parametrize("pooling", ["mean", "max", "mean_max"])
def test_sequence_pooling_covers_the_words_only(pooling):
    model = tiny_model(ElmoForSequenceClassification, classifier_pooling=pooling, scalar_mix_layers=[2, 0])
    encoded = batch()
    with torch.no_grad():
        logits = model(**encoded).logits.numpy()
    mixed = mixed_elmo(model, bilm_layers(model, encoded))
    weight, bias = model.classifier.weight.detach().numpy(), model.classifier.bias.detach().numpy()
    for row, sentence in enumerate(SENTENCES):
        words = mixed[row, 1 : len(sentence) + 1]
        pooled = {
            "mean": words.mean(0) if len(words) else np.zeros(12),
            "max": words.max(0) if len(words) else np.zeros(12),
        }
        features = np.concatenate([pooled[p] for p in pooling.split("_")])
        np.testing.assert_allclose(logits[row], features @ weight.T + bias, rtol=0, atol=1e-12)


def test_task_encoder_output_per_sentence_is_independent_of_batch_and_padding():
    words = ["the", "cat", "Mat"]
    model = tiny_model(
        ElmoForTokenClassification,
        task_encoder_hidden_size=4,
        task_encoder_num_layers=2,
        elmo_placement=["input", "output"],
        scalar_mix_layer_norm=False,
        word_vectors_size=len(words),
        word_vectors_dim=3,
    )
    model.set_word_vectors(torch.randn(len(words), 3, dtype=torch.float64), words)
    together = batch()
    with torch.no_grad():
        logits = model(**together).logits
        for row, sentence in enumerate(SENTENCES):
            alone = model(**batch([sentence])).logits[0]
            n = len(sentence) + 2
            assert torch.allclose(alone, logits[row, :n], rtol=0, atol=1e-12)
            assert not logits[row, n:].any()
    # Recompute one sentence by hand: [ELMo | word vector] -> BiLSTM -> [h | ELMo'] -> classifier.
    encoded = batch(SENTENCES[:1])
    layers = bilm_layers(model, encoded)
    n = len(SENTENCES[0])
    vectors = model.task_encoder.word_vectors(encoded["input_ids"][:, 1:-1]).detach().numpy()
    inputs = np.concatenate([mixed_elmo(model, layers, "input")[:, 1 : n + 1], vectors], axis=-1)
    with torch.no_grad():
        hidden = model.task_encoder.lstm(torch.from_numpy(inputs))[0].numpy()
    features = np.concatenate([hidden, mixed_elmo(model, layers, "output")[:, 1 : n + 1]], axis=-1)
    expected = features @ model.classifier.weight.detach().numpy().T + model.classifier.bias.detach().numpy()
    np.testing.assert_allclose(logits[0, 1 : n + 1].numpy(), expected[0], rtol=0, atol=1e-12)


def test_scalar_mix_layer_norm_uses_the_statistics_with_boundaries():
    model = tiny_model(ElmoForTokenClassification, scalar_mix_layer_norm=True)
    encoded = batch()
    with torch.no_grad():
        logits = model(**encoded).logits.numpy()
    layers, mask = bilm_layers(model, encoded), encoded["attention_mask"].numpy().astype(float)[..., None]
    normed = np.empty_like(layers)
    for k in range(layers.shape[2]):
        h = layers[:, :, k]
        count = mask.sum() * h.shape[-1]
        mean = (h * mask).sum() / count
        variance = (((h * mask - mean) * mask) ** 2).sum() / count
        normed[:, :, k] = (h - mean) / np.sqrt(variance + 1e-13)
    mixed = mixed_elmo(model, normed)
    weight, bias = model.classifier.weight.detach().numpy(), model.classifier.bias.detach().numpy()
    n = len(SENTENCES[0])
    np.testing.assert_allclose(logits[0, 1 : n + 1], mixed[0, 1 : n + 1] @ weight.T + bias, rtol=0, atol=1e-12)


def test_word_vectors_are_found_from_the_characters():
    model = ElmoForTokenClassification(
        tiny_config(word_vectors_size=3, word_vectors_dim=2, word_vectors_lowercase=True)
    )
    vectors = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    model.set_word_vectors(vectors, ["the", "cat", "über"])
    ids = batch([["The", "CAT", "dog", "Über", "the"]])["input_ids"]
    found = model.task_encoder.word_vectors(ids)[0]
    # <S>, The, CAT, dog (unknown), Über (non-ASCII: not lowercased, unknown), the, </S>
    expected = torch.tensor([[0, 0], [1, 2], [3, 4], [0, 0], [0, 0], [1, 2], [0, 0]], dtype=torch.float)
    assert torch.equal(found, expected)
    cased = ElmoForTokenClassification(tiny_config(word_vectors_size=2, word_vectors_dim=2))
    cased.set_word_vectors(vectors[:2], ["The", "the"])
    assert torch.equal(
        cased.task_encoder.word_vectors(batch([["the", "The", "THE"]])["input_ids"])[0, 1:4],
        torch.tensor([[3.0, 4.0], [1.0, 2.0], [0.0, 0.0]]),
    )
    with pytest.raises(ValueError, match="'the' .* and 'The' .* map to the same entry once lowercased"):
        model.set_word_vectors(vectors, ["the", "The", "x"])
    with pytest.raises(
        ValueError, match=r"holds 3 word vectors of size 2 .* got vectors of shape \(2, 2\) and 2 words"
    ):
        model.set_word_vectors(vectors[:2], ["a", "b"])
    with pytest.raises(ValueError, match="has no word vectors: build it with word_vectors_size"):
        ElmoForTokenClassification(tiny_config()).set_word_vectors(vectors, ["a", "b", "c"])


# --- losses and labels --------------------------------------------------------------------------------------------


def test_sequence_losses_follow_problem_type():
    encoded = batch()
    single = tiny_model(ElmoForSequenceClassification, num_labels=3)
    labels = torch.tensor([2, 0, 1, 1])
    out = single(**encoded, labels=labels)
    assert single.config.problem_type == "single_label_classification"
    logits = out.logits.detach().numpy()
    expected = np.mean([-np.log(softmax(row)[label]) for row, label in zip(logits, labels.tolist())])
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)

    multi = tiny_model(ElmoForSequenceClassification, num_labels=3)
    targets = torch.tensor([[1.0, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]], dtype=torch.float64)
    out = multi(**encoded, labels=targets)
    assert multi.config.problem_type == "multi_label_classification"
    p = 1 / (1 + np.exp(-out.logits.detach().numpy()))
    y = targets.numpy()
    assert out.loss.item() == pytest.approx(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)), abs=1e-12)

    regression = tiny_model(ElmoForSequenceClassification, num_labels=1)
    targets = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
    out = regression(**encoded, labels=targets)
    assert regression.config.problem_type == "regression"
    assert out.loss.item() == pytest.approx(
        np.mean((out.logits.detach().numpy()[:, 0] - targets.numpy()) ** 2), abs=1e-12
    )


def test_l2_penalty_on_the_scalar_mix_weights_is_added_to_the_loss():
    encoded = batch()
    labels = torch.tensor([2, 0, 1, 1])
    plain = tiny_model(
        ElmoForSequenceClassification, num_labels=3, task_encoder_hidden_size=3, elmo_placement=["input", "output"]
    )
    penalised = (
        ElmoForSequenceClassification(
            tiny_config(num_labels=3, task_encoder_hidden_size=3, elmo_placement=["input", "output"], scalar_mix_l2=0.1)
        )
        .double()
        .eval()
    )
    penalised.load_state_dict(plain.state_dict())
    weights = [m.scalar_parameters.detach().numpy() for m in plain.task_encoder.scalar_mixes.values()]
    difference = penalised(**encoded, labels=labels).loss - plain(**encoded, labels=labels).loss
    assert difference.item() == pytest.approx(0.1 * sum((w**2).sum() for w in weights), abs=1e-12)
    assert torch.equal(penalised(**encoded).logits, plain(**encoded).logits)


def test_token_labels_are_aligned_with_boundaries_padding_and_truncation():
    tokenizer = ElmoTokenizer()
    words = [["a", "b", "c", "d"], ["x"]]
    labels = [[1, 2, 3, 4], [7]]
    encoded = tokenize_and_align_labels(tokenizer, words, labels, padding=True, truncation=True, max_length=5)
    assert encoded["labels"] == [[-100, 1, 2, 3, -100], [-100, 7, -100, -100, -100]]
    tokenizer.truncation_side = "left"
    encoded = tokenize_and_align_labels(
        tokenizer, words, labels, truncation=True, max_length=4, return_tensors="pt", padding=True
    )
    assert encoded["labels"].tolist() == [[-100, 3, 4, -100], [-100, 7, -100, -100]]
    # String labels through label2id; the collator pads per-position labels with -100.
    tokenizer.truncation_side = "right"
    encoded = tokenize_and_align_labels(tokenizer, words, [["N", "V", "N", "N"], ["V"]], label2id={"N": 0, "V": 1})
    features = [{key: encoded[key][i] for key in encoded} for i in range(2)]
    collated = DataCollatorForElmo(tokenizer)(features)
    assert collated["labels"].tolist() == [[-100, 0, 1, 0, 0, -100], [-100, 1, -100, -100, -100, -100]]
    assert torch.equal(
        collated["input_ids"],
        tokenizer(words, is_split_into_words=True, padding=True, return_tensors="pt")["input_ids"],
    )
    model = ElmoForTokenClassification(tiny_config(num_labels=2))
    assert torch.isfinite(model(**collated).loss)


def test_bad_labels_give_clear_errors():
    tokenizer = ElmoTokenizer()
    with pytest.raises(ValueError, match="Sentence 1 has 1 words but 2 labels"):
        tokenize_and_align_labels(tokenizer, [["a"], ["b"]], [[0], [0, 1]])
    with pytest.raises(ValueError, match=r"labels missing from label2id: \['X'\]"):
        tokenize_and_align_labels(tokenizer, [["a"]], [["X"]], label2id={"N": 0})
    model = ElmoForTokenClassification(tiny_config(num_labels=3))
    encoded = batch()
    good = torch.full(encoded["attention_mask"].shape, -100)
    good[0, 1:8] = 1
    for labels, message in [
        (good[:, :-1], r"one entry per input position, shape \(4, 9\)"),
        (good.index_fill(1, torch.tensor([0]), 1), r"labels\[0, 0\] = 1 labels a <S> position"),
        (
            good.index_put((torch.tensor([1]), torch.tensor([2])), torch.tensor(1)),
            r"labels\[1, 2\] = 1 labels a </S> position",
        ),
        (
            good.index_put((torch.tensor([1]), torch.tensor([4])), torch.tensor(1)),
            r"labels\[1, 4\] = 1 labels a padding position",
        ),
        (
            good.index_put((torch.tensor([0]), torch.tensor([3])), torch.tensor(3)),
            r"Labels must be -100 or in \[0, 2\]",
        ),
        (good.float(), "integer class ids"),
    ]:
        with pytest.raises(ValueError, match=message):
            model(**encoded, labels=labels)
    unframed = ElmoTokenizer()(
        SENTENCES[:3], is_split_into_words=True, padding=True, return_tensors="pt", add_special_tokens=False
    )
    with pytest.raises(ValueError, match="framed by the <S> and </S> rows"):
        model(**unframed)
    classifier = ElmoForSequenceClassification(tiny_config(num_labels=3))
    with pytest.raises(ValueError, match=r"Labels must be in \[0, 2\]"):
        classifier(**encoded, labels=torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match=r"Multi-label classification needs labels of shape \(4, 3\)"):
        ElmoForSequenceClassification(tiny_config(num_labels=3))(**encoded, labels=torch.ones(4, 2))
    classifier.config.problem_type = "ordinal"
    with pytest.raises(ValueError, match="Unknown problem_type 'ordinal'"):
        classifier(**encoded, labels=torch.tensor([0, 1, 2, 1]))


def test_bad_head_options_give_clear_errors(converted_dirs, tmp_path):
    with pytest.raises(ValueError, match="problem_type must be one of"):
        AutoModelForSequenceClassification.from_pretrained(converted_dirs["allennlp"], problem_type="ordinal")
    with pytest.raises(ValueError, match="'output' needs a task encoder"):
        tiny_config(elmo_placement=["output"])
    with pytest.raises(ValueError, match=r"scalar_mix_layers must be in \[0, 2\]"):
        tiny_config(scalar_mix_layers=[3])
    with pytest.raises(ValueError, match=r"scalar_mix_weights needs one value per mixed layer \(2\)"):
        tiny_config(scalar_mix_layers=[0, 2], scalar_mix_weights=[1.0])
    # A saved classifier loaded for another number of labels.
    ElmoForTokenClassification(tiny_config(num_labels=4)).save_pretrained(tmp_path / "tagger")
    with pytest.raises(RuntimeError, match="holds a classifier for 4 labels but 17 labels were requested"):
        AutoModelForTokenClassification.from_pretrained(tmp_path / "tagger", num_labels=17)
    with pytest.raises(RuntimeError, match="holds a classifier for 4 labels but 2 labels were requested"):
        ElmoForTokenClassification.from_pretrained(tmp_path / "tagger", id2label={0: "A", 1: "B"})
    assert (
        AutoModelForTokenClassification.from_pretrained(
            tmp_path / "tagger", num_labels=17, ignore_mismatched_sizes=True
        ).classifier.out_features
        == 17
    )


# --- the frozen-biLM cache ---------------------------------------------------------------------------------------


def ewt_dataset(tokenizer, n, label_of=None):
    import importlib.util

    spec = importlib.util.spec_from_file_location("pos_tagging", ROOT / "examples/pos_tagging.py")
    pos_tagging = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pos_tagging)
    words, tags = pos_tagging.read_conllu(pos_tagging.DATA / "en_ewt-ud-dev.conllu", n)
    label2id = {tag: i for i, tag in enumerate(sorted({t for s in tags for t in s}))}
    if label_of is None:
        encoded = tokenize_and_align_labels(tokenizer, words, tags, label2id=label2id)
    else:
        encoded = tokenizer(words, is_split_into_words=True)
        encoded["labels"] = [label_of(sentence) for sentence in tags]
    return Dataset.from_dict(dict(encoded)), len(label2id)


def training_args(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        learning_rate=1e-2,
        num_train_epochs=8,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
    )
    values.update(overrides)
    return TrainingArguments(**values)


def test_cached_layers_give_the_same_training_as_running_the_bilm(converted_dirs, tmp_path, single_thread):
    folder = converted_dirs["allennlp"]
    tokenizer = ElmoTokenizer()
    dataset, num_labels = ewt_dataset(tokenizer, 24)
    model = AutoModelForTokenClassification.from_pretrained(folder, num_labels=num_labels)
    # Cached with the training batches (sequential, 8 at a time) so that every float is computed the same way.
    cached = dataset.map(ElmoLayerCache(model, batch_size=8), batched=True, batch_size=24)
    assert np.asarray(cached[0]["elmo_hidden_states"]).shape == (len(dataset[0]["input_ids"]), 3, 32)
    trained = {}
    for name, data in {"uncached": dataset, "cached": cached.with_format("numpy")}.items():
        set_seed(0)
        model = AutoModelForTokenClassification.from_pretrained(
            folder, num_labels=num_labels, task_encoder_hidden_size=4
        )
        args = training_args(tmp_path, train_sampling_strategy="sequential", num_train_epochs=1)
        Trainer(model=model, args=args, train_dataset=data, data_collator=DataCollatorForElmo(tokenizer)).train()
        trained[name] = model.state_dict()
    assert trained["cached"].keys() == trained["uncached"].keys()
    assert all(torch.equal(trained["cached"][k], trained["uncached"][k]) for k in trained["cached"])
    with pytest.raises(ValueError, match="cannot be used with freeze_elmo=False"):
        ElmoForTokenClassification(tiny_config(freeze_elmo=False))(
            **batch(), elmo_hidden_states=torch.zeros(4, 9, 3, 12)
        )
    with pytest.raises(ValueError, match=r"elmo_hidden_states must have shape \(4, 9, 3, 12\)"):
        ElmoForTokenClassification(tiny_config())(**batch(), elmo_hidden_states=torch.zeros(4, 9, 2, 12))
    with pytest.raises(ValueError, match="needs a frozen biLM"):
        ElmoLayerCache(ElmoForTokenClassification(tiny_config(freeze_elmo=False)))


# --- training with Trainer ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("head", ["token", "sequence"])
def test_trainer_lowers_the_loss_keeps_the_bilm_and_round_trips(head, converted_dirs, tmp_path, single_thread):
    folder = converted_dirs["allennlp"]
    tokenizer = ElmoTokenizer()
    if head == "token":
        dataset, num_labels = ewt_dataset(tokenizer, 32)
        auto = AutoModelForTokenClassification
    else:
        # A three-way sentence label: what the first word is.
        first = {"PRON": 0, "DET": 1}
        dataset, _ = ewt_dataset(tokenizer, 32, label_of=lambda tags: first.get(tags[0], 2))
        num_labels, auto = 3, AutoModelForSequenceClassification
    model = auto.from_pretrained(folder, num_labels=num_labels, task_encoder_hidden_size=8)
    bilm_before = {k: v.clone() for k, v in model.elmo.state_dict().items()}
    mix_before = model.task_encoder.scalar_mixes["input"].scalar_parameters.detach().clone()
    trainer = Trainer(
        model=model,
        args=training_args(tmp_path),
        train_dataset=dataset,
        eval_dataset=dataset,
        data_collator=DataCollatorForElmo(tokenizer),
    )
    loss_before = trainer.evaluate()["eval_loss"]
    trainer.train()
    loss_after = trainer.evaluate()["eval_loss"]
    assert loss_after < 0.9 * loss_before, (loss_before, loss_after)
    assert all(torch.equal(v, bilm_before[k]) for k, v in model.elmo.state_dict().items()), "the frozen biLM changed"
    assert not torch.equal(model.task_encoder.scalar_mixes["input"].scalar_parameters.detach(), mix_before)

    trainer.save_model(tmp_path / "saved")
    reloaded = auto.from_pretrained(tmp_path / "saved")
    assert type(reloaded) is type(model)
    probe = DataCollatorForElmo(tokenizer)([dataset[i] for i in range(6)])
    probe.pop("labels")
    with torch.no_grad():
        assert torch.equal(reloaded(**probe).logits, model.eval()(**probe).logits)

    if head == "token":  # the counter-check: with freeze_elmo=False the same training does change the biLM
        tuned = auto.from_pretrained(folder, num_labels=num_labels, freeze_elmo=False)
        args = training_args(tmp_path, max_steps=2)
        Trainer(model=tuned, args=args, train_dataset=dataset, data_collator=DataCollatorForElmo(tokenizer)).train()
        assert not all(torch.equal(v, bilm_before[k]) for k, v in tuned.elmo.state_dict().items())


def test_pos_tagging_example_prints_the_ablation_table(converted_dirs, tmp_path):
    import re
    import subprocess
    import sys

    ablations = ["top layer only (input)", "all layers, learned weights (input + output)"]
    command = [sys.executable, str(ROOT / "examples/pos_tagging.py"), "--model", str(converted_dirs["allennlp"])]
    command += ["--train-sentences", "16", "--eval-sentences", "16", "--epochs", "1", "--output-dir", str(tmp_path)]
    command += ["--predictions", str(tmp_path / "predictions.json"), "--save-taggers"]
    result = subprocess.run(command + ["--ablations", *ablations], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = re.findall(r"^\| (.+?) \| ([0-9.]+) \| (.+) \|$", result.stdout, flags=re.M)
    assert [name for name, _, _ in rows] == ablations
    # The truth, counted here: the words and UPOS column of the file's first 16 sentences, each saved tagger run on
    # those words, its tag at the position of each word (the batch's own word_ids), against the gold tag.
    sentences = [[]]
    for line in (ROOT / "examples/data/ud_english_ewt/en_ewt-ud-test.conllu").read_text(encoding="utf-8").splitlines():
        columns = line.split("\t")
        if len(columns) == 10 and columns[0].isdigit():
            sentences[-1].append((columns[1], columns[3]))
        elif not line.strip() and sentences[-1]:
            sentences.append([])
    sentences = sentences[:16]
    words = [[word for word, _ in sentence] for sentence in sentences]
    gold = [[tag for _, tag in sentence] for sentence in sentences]
    batch = ElmoTokenizer.from_pretrained(converted_dirs["allennlp"])(
        words, is_split_into_words=True, padding=True, return_tensors="pt"
    )
    predicted = json.loads((tmp_path / "predictions.json").read_text())
    for name, accuracy, _ in rows:
        tagger = ElmoForTokenClassification.from_pretrained(tmp_path / name.replace(" ", "_")).eval()
        with torch.no_grad():
            best = tagger(**batch).logits.argmax(-1)
        tags = [[None] * len(sentence) for sentence in words]
        for k in range(len(words)):
            for position, word in enumerate(batch.word_ids(k)):
                if word is not None:
                    tags[k][word] = tagger.config.id2label[int(best[k, position])]
        correct = sum(p == g for sentence, gold_tags in zip(tags, gold) for p, g in zip(sentence, gold_tags))
        assert float(accuracy) == pytest.approx(100 * correct / sum(map(len, gold)), abs=0.005), name
        assert predicted[name] == tags, name  # the example's --predictions, one tag a word
    assert rows[0][2] == "—" and rows[1][2].startswith("input [") and ", output [" in rows[1][2]
