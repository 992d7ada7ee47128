"""The common model contract of transformers, as its own `ModelTesterMixin` checks it, for every ELMo class: loading
from a state dict without a folder, initialising exactly the weights a checkpoint lacks, hidden states from the
heads, a useful `ElmoForBiLM` output without labels, the input embeddings, gradient checkpointing and
the error of a classifier of another size."""

import h5py
import pytest
import torch
from conftest import FIXTURES
from datasets import Dataset
from torch import nn
from transformers import Trainer, TrainingArguments, default_data_collator

from hf_elmo import (
    ElmoConfig,
    ElmoForBiLM,
    ElmoForQuestionAnswering,
    ElmoForSequenceClassification,
    ElmoForTokenClassification,
    ElmoModel,
    ElmoTokenizer,
)

HEADS = [ElmoForTokenClassification, ElmoForSequenceClassification]
SENTENCES = [["The", "cat", "sat", "on", "the", "mat", "."], ["Hi"], ["Über", "naïve", "words"], []]


def tiny_config(**overrides):
    values = dict(
        char_embedding_dim=4,
        filters=[[1, 4], [2, 6]],
        n_highway=1,
        cell_dim=12,
        projection_dim=6,
        num_layers=2,
        dropout=0.0,
        num_labels=3,
        vocab_size=20,
    )
    values.update(overrides)
    return ElmoConfig(**values)


def randomised(model):
    """`model` with every parameter random: values no initialisation gives."""
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn_like(param))
    return model


def batch(sentences=SENTENCES):
    return ElmoTokenizer()(sentences, is_split_into_words=True, padding=True, return_tensors="pt")


def bilm_labels(encoded):
    """Forward and backward targets at every word position of `encoded` (ids below `tiny_config`'s vocab_size)."""
    mask = encoded["attention_mask"].bool()
    labels = torch.randint(3, 20, (*mask.shape, 2))
    return labels.masked_fill(~mask[..., None], -100)


# --- loading and initialisation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [ElmoModel, ElmoForBiLM, *HEADS, ElmoForQuestionAnswering])
def test_every_class_loads_from_none_with_a_config_and_a_state_dict(cls):
    model = randomised(cls(tiny_config()))
    loaded = cls.from_pretrained(None, config=model.config, state_dict=model.state_dict())
    assert type(loaded) is cls and loaded.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    # Checked as a folder's weights are: a biLM tensor missing is refused, not filled with fresh values.
    lacking = {k: v for k, v in model.state_dict().items() if not k.endswith("state_projection.weight")}
    with pytest.raises(ValueError, match=r"state_dict lacks 4 tensor\(s\) of the model .* e\.g\. '.*state_projection"):
        cls.from_pretrained(None, config=model.config, state_dict=lacking)


@pytest.mark.parametrize("cls", HEADS)
@pytest.mark.parametrize("source", ["folder", "state_dict"])
def test_a_head_on_a_base_checkpoint_initialises_exactly_the_weights_it_lacks(cls, source, tmp_path):
    base = randomised(ElmoModel(tiny_config()))
    options = dict(
        num_labels=4,
        task_encoder_hidden_size=5,
        elmo_placement=["input", "output"],
        scalar_mix_weights=[1.5, 0.0, -2.0],
        scalar_mix_gamma=0.25,
        word_vectors_size=3,
        word_vectors_dim=2,
    )
    if source == "folder":
        base.save_pretrained(tmp_path)
        head, info = cls.from_pretrained(tmp_path, output_loading_info=True, **options)
    else:
        config = tiny_config(**options)
        head, info = cls.from_pretrained(None, config=config, state_dict=base.state_dict(), output_loading_info=True)
    new = {name for name in head.state_dict() if not name.startswith("elmo.")}
    assert set(info["missing_keys"]) == new and not info["mismatched_keys"]
    # Loaded: the base's values exactly, none of them re-initialised.
    assert {f"elmo.{name}" for name in base.state_dict()} == set(head.state_dict()) - new
    assert all(torch.equal(head.elmo.state_dict()[k], v) for k, v in base.state_dict().items())
    # New: each one initialised, to values memory garbage cannot match.
    for mix in head.task_encoder.scalar_mixes.values():
        assert mix.scalar_parameters.tolist() == [1.5, 0.0, -2.0] and mix.gamma.tolist() == [0.25]
    vectors = head.task_encoder.word_vectors
    assert not vectors.weight.any() and (vectors.sorted_keys == -1).all() and not vectors.rows.any()
    bound = 1 / 5**0.5
    for name, param in head.task_encoder.lstm.named_parameters():
        assert param.abs().max() <= bound and param.std() > bound / 4, name  # PyTorch's uniform(-bound, bound)
    assert not head.classifier.bias.any()
    assert 0.01 < head.classifier.weight.std() < 0.04  # transformers' normal(0, 0.02) of a Linear


def test_a_classifier_of_another_size_raises_what_transformers_raises_unless_mismatches_are_ignored(tmp_path):
    tagger = randomised(ElmoForTokenClassification(tiny_config(num_labels=4)))
    tagger.save_pretrained(tmp_path)
    with pytest.raises(RuntimeError, match="holds a classifier for 4 labels but 7 labels were requested"):
        ElmoForTokenClassification.from_pretrained(tmp_path, num_labels=7)
    replaced = ElmoForTokenClassification.from_pretrained(tmp_path, num_labels=7, ignore_mismatched_sizes=True)
    assert replaced.classifier.weight.shape == (7, tagger.task_encoder.output_size)
    assert not replaced.classifier.bias.any()
    assert all(torch.equal(replaced.elmo.state_dict()[k], v) for k, v in tagger.elmo.state_dict().items())


# --- outputs -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", HEADS)
def test_heads_return_the_bilm_layers_when_asked_by_argument_or_config(cls):
    head = randomised(cls(tiny_config())).double().eval()
    encoded = batch()
    with torch.no_grad():
        expected = head.elmo(**encoded, output_hidden_states=True).hidden_states
        assert len(expected) == head.config.num_layers + 1
        by_argument = head(**encoded, output_hidden_states=True)
        assert head(**encoded).hidden_states is None
        head.config.output_hidden_states = True
        by_config = head(**encoded)
        assert head(**encoded, output_hidden_states=False).hidden_states is None
        cached = torch.stack(expected, dim=2)
        from_cache = head(**encoded, elmo_hidden_states=cached)
    for output in (by_argument, by_config, from_cache):
        assert len(output.hidden_states) == len(expected)
        assert all(torch.equal(a, b) for a, b in zip(output.hidden_states, expected))
        assert torch.equal(output.logits, by_argument.logits)
    assert torch.equal(by_argument.to_tuple()[1][0], expected[0])  # after the logits, as transformers orders them


def test_bilm_without_labels_returns_its_top_layer_first():
    bilm = randomised(ElmoForBiLM(tiny_config())).double().eval()
    encoded = batch()
    with torch.no_grad():
        top = bilm.elmo(**encoded).last_hidden_state
        outputs = bilm(**encoded)
        as_tuple = bilm(**encoded, return_dict=False)
        with_logits = bilm(**encoded, return_logits=True)
        with_labels = bilm(**encoded, labels=bilm_labels(encoded))
    assert torch.equal(outputs[0], top) and torch.equal(outputs.last_hidden_state, top)
    assert torch.equal(as_tuple[0], top) and torch.equal(with_logits[0], top)
    assert torch.equal(with_logits.forward_logits, bilm.softmax(top[..., :6]))
    assert with_labels.last_hidden_state is None and torch.equal(with_labels[0], with_labels.loss)


# --- the character embedding ---------------------------------------------------------------------------------------


def test_the_character_embedding_is_an_nn_embedding_whose_id_0_stays_a_fixed_zero(converted_dirs):
    model = ElmoModel.from_pretrained(converted_dirs["allennlp"])
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, nn.Embedding)
    with h5py.File(FIXTURES / "allennlp" / "lm_weights.hdf5", "r") as weights:
        char_embed = torch.from_numpy(weights["char_embed"][...])
    # The saved name and rows are the original file's: one per character id but 0.
    assert list(model.state_dict())[0] == "char_encoder.char_embedding.weight"
    assert torch.equal(model.state_dict()["char_encoder.char_embedding.weight"], char_embed.float())
    ids = torch.tensor([[0, 1, 5, 0], [261, 0, 2, 3]])
    table = torch.cat([torch.zeros(1, char_embed.shape[1]), char_embed.float()])
    assert torch.equal(embedding(ids), table[ids])
    # Trained, id 0 still reads exactly zero: it is no parameter.
    optimizer = torch.optim.SGD(embedding.parameters(), lr=1.0, weight_decay=0.5)
    embedding(ids).pow(2).sum().backward()
    optimizer.step()
    assert embedding.weight.shape == char_embed.shape
    assert not embedding(torch.zeros(3, dtype=torch.long)).any()
    assert not torch.equal(embedding(ids), table[ids])
    with pytest.raises(NotImplementedError, match="has no token embeddings to resize"):
        model.resize_token_embeddings(300)


# --- gradient checkpointing ----------------------------------------------------------------------------------------


def gradients(model, loss_of):
    """The gradients of `loss_of(model)` and how many tensors its forward pass kept for the backward pass."""
    model.zero_grad()
    torch.manual_seed(3)  # the same dropout masks each time
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(1) or t, lambda t: t):
        loss = loss_of(model)
    loss.backward()
    return {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}, len(kept)


@pytest.mark.filterwarnings("ignore:`(gradient_checkpointing_enable|is_gradient_checkpointing)` is deprecated")
@pytest.mark.parametrize("enable", ["activation_checkpointing_enable", "gradient_checkpointing_enable"])
@pytest.mark.parametrize("cls", [ElmoForBiLM, ElmoForTokenClassification])
def test_gradient_checkpointing_gives_the_gradients_of_a_plain_backward(cls, enable):
    """Under transformers 5's name and the older one, which it still accepts (deprecated)."""
    config = tiny_config(dropout=0.3, elmo_dropout=0.2, freeze_elmo=False)
    model = randomised(cls(config)).double().train()
    encoded = batch()
    if cls is ElmoForBiLM:
        labels = bilm_labels(encoded)
    else:
        labels = torch.randint(0, 3, encoded["attention_mask"].shape).masked_fill(encoded["attention_mask"] == 0, -100)
        labels[:, 0] = -100
        labels[torch.arange(4), encoded["attention_mask"].sum(1) - 1] = -100

    def loss_of(model):
        return model(**encoded, labels=labels).loss

    plain, kept_without = gradients(model, loss_of)
    getattr(model, enable)()
    assert model.elmo.gradient_checkpointing
    checkpointed, kept_with = gradients(model, loss_of)
    assert kept_with < kept_without / 2  # the biLM's own are recomputed in the backward pass
    assert plain.keys() == checkpointed.keys() == {n for n, p in model.named_parameters() if p.requires_grad}
    assert any(name.startswith("elmo.char_encoder.") for name in plain)
    for name, grad in plain.items():
        assert torch.equal(checkpointed[name], grad), name
    with pytest.raises(ValueError, match="use_reentrant=False only"):
        cls(config).gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated")
@pytest.mark.parametrize("flag", ["activation_checkpointing", "gradient_checkpointing"])
def test_trainer_with_gradient_checkpointing_takes_the_same_steps(tmp_path, flag):
    tokenizer = ElmoTokenizer()
    encoded = tokenizer(
        [words for words in SENTENCES if words], is_split_into_words=True, padding=True, return_tensors="pt"
    )
    rows = {"input_ids": encoded["input_ids"].tolist(), "attention_mask": encoded["attention_mask"].tolist()}
    rows["labels"] = bilm_labels(encoded).tolist()
    dataset = Dataset.from_dict(rows)
    start = randomised(ElmoForBiLM(tiny_config(dropout=0.3))).state_dict()
    trained = {}
    for checkpointing in (False, True):
        model = ElmoForBiLM(tiny_config(dropout=0.3))
        model.load_state_dict(start)
        args = TrainingArguments(
            output_dir=str(tmp_path / str(checkpointing)),
            **{flag: checkpointing},
            max_steps=2,
            per_device_train_batch_size=2,
            learning_rate=0.1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            seed=5,
        )
        Trainer(model=model, args=args, train_dataset=dataset, data_collator=default_data_collator).train()
        assert model.elmo.gradient_checkpointing == checkpointing
        trained[checkpointing] = model.state_dict()
    assert any(not torch.equal(start[k], v) for k, v in trained[False].items())
    for name, value in trained[False].items():
        assert torch.equal(trained[True][name], value), name
