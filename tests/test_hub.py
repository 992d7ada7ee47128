"""push_to_hub and Trainer(push_to_hub=True) against a faked Hub (see fake_hub.py for what it does not cover), then
loading by repo id in a fresh, offline process where hf_elmo cannot be imported: the remote-code path users get."""

import json
import textwrap

import numpy as np
import torch
from huggingface_hub import ModelCard
from transformers import AutoModelForTokenClassification, AutoTokenizer, Trainer, TrainingArguments

from hf_elmo.data_elmo import DataCollatorForElmo, tokenize_and_align_labels

from conftest import run_without_hf_elmo
from fake_hub import FakeHub

WORDS = [["The", "bank", "of", "the", "river", "."], ["Deposit", "money", "!"]]
LABELS = {0: "DET", 1: "NOUN", 2: "ADP", 3: "PUNCT", 4: "VERB"}
TAGS = [["DET", "NOUN", "ADP", "DET", "NOUN", "PUNCT"], ["VERB", "NOUN", "PUNCT"]]


def load_in_fresh_process(cache, tmp_path, repo_id):
    """Logits of AutoModelForTokenClassification and top layer of AutoModel, both loaded by repo id offline."""
    script = textwrap.dedent(
        f"""
        import numpy, torch
        from transformers import AutoModel, AutoModelForTokenClassification, AutoTokenizer
        tagger = AutoModelForTokenClassification.from_pretrained({repo_id!r}, trust_remote_code=True).eval()
        bilm = AutoModel.from_pretrained({repo_id!r}, trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained({repo_id!r}, trust_remote_code=True)
        assert type(tagger).__module__.startswith("transformers_modules"), type(tagger).__module__
        assert type(tokenizer).__name__ == "ElmoTokenizer", type(tokenizer)
        batch = tokenizer({WORDS!r}, is_split_into_words=True, padding=True, return_tensors="pt")
        with torch.no_grad():
            numpy.save("logits.npy", tagger(**batch).logits.numpy())
            numpy.save("top.npy", bilm(**batch).last_hidden_state.numpy())
        """
    )
    run_without_hf_elmo(script, tmp_path, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache))
    return np.load(tmp_path / "logits.npy"), np.load(tmp_path / "top.npy")


def outputs(model, tokenizer):
    batch = tokenizer(WORDS, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model.eval()(**batch).logits.numpy(), model.elmo(**batch).last_hidden_state.numpy()


def test_push_to_hub_then_load_by_repo_id_without_the_package(converted_dirs, tmp_path, monkeypatch):
    hub = FakeHub(tmp_path / "hub-cache").install(monkeypatch)
    folder = converted_dirs["allennlp"]
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_pretrained(folder, id2label=LABELS, task_encoder_hidden_size=4)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.push_to_hub("org/elmo-tagger")  # first: transformers uploads its placeholder card
    model.push_to_hub("org/elmo-tagger", datasets=["universal_dependencies"], tags=["pos"])

    snapshot = hub.snapshot("org/elmo-tagger")
    files = {p.name for p in snapshot.iterdir()}
    code = {
        "configuration_elmo.py",
        "modeling_elmo.py",
        "modeling_elmo_heads.py",
        "character_rows.py",
        "scalar_mix.py",
        "sampled_softmax.py",
        "pipelines_elmo.py",
        "hub_elmo.py",
        "tokenization_elmo.py",
    }
    assert code | {"config.json", "model.safetensors", "tokenizer_config.json", "README.md"} <= files
    auto_map = json.loads((snapshot / "config.json").read_text())["auto_map"]
    assert set(auto_map) == {
        "AutoConfig",
        "AutoModel",
        "AutoModelForPreTraining",
        "AutoTokenizer",
        "AutoModelForSequenceClassification",
        "AutoModelForTokenClassification",
        "AutoModelForQuestionAnswering",
    }
    assert "tokenization_elmo.ElmoTokenizer" in json.dumps(json.loads((snapshot / "tokenizer_config.json").read_text()))

    card = ModelCard.load(snapshot / "README.md")
    assert card.data.library_name == "transformers" and card.data.license == "apache-2.0"
    assert card.data.pipeline_tag == "token-classification" and card.data.datasets == ["universal_dependencies"]
    assert {"elmo", "custom_code", "pos"} <= set(card.data.tags)
    assert "org/elmo-tagger" in card.text and "automatically generated" not in card.text
    assert all(label in card.text for label in LABELS.values())

    logits, top = load_in_fresh_process(tmp_path / "hub-cache", tmp_path, "org/elmo-tagger")
    expected_logits, expected_top = outputs(model, tokenizer)
    assert np.array_equal(logits, expected_logits) and np.array_equal(top, expected_top)

    # A second push keeps the card the repository now has (users may have edited it).
    (snapshot / "README.md").write_text(card.content.replace("# ELMo", "# Edited ELMo"))
    model.push_to_hub("org/elmo-tagger")
    assert "# Edited ELMo" in (hub.snapshot("org/elmo-tagger") / "README.md").read_text()


def test_trainer_push_to_hub(converted_dirs, tmp_path, monkeypatch):
    hub = FakeHub(tmp_path / "hub-cache").install(monkeypatch)
    folder = converted_dirs["allennlp"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForTokenClassification.from_pretrained(folder, id2label=LABELS)
    label2id = {v: k for k, v in LABELS.items()}
    encoded = tokenize_and_align_labels(tokenizer, WORDS * 4, TAGS * 4, label2id=label2id)
    dataset = [{key: encoded[key][i] for key in encoded} for i in range(len(WORDS) * 4)]
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        push_to_hub=True,
        hub_model_id="org/elmo-trained",
        max_steps=4,
        save_strategy="steps",
        save_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=DataCollatorForElmo(tokenizer),
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.push_to_hub()
    assert len(hub.commits) >= 2, hub.commits  # checkpoints pushed during training, then the final model
    files = hub.commits[-1][2]
    assert {"modeling_elmo.py", "model.safetensors", "tokenizer_config.json", "README.md"} <= set(files)
    logits, top = load_in_fresh_process(tmp_path / "hub-cache", tmp_path, "org/elmo-trained")
    expected_logits, expected_top = outputs(model, tokenizer)
    assert np.array_equal(logits, expected_logits) and np.array_equal(top, expected_top)


def test_model_card_for_each_class(converted_dirs):
    from hf_elmo import ElmoForSequenceClassification, ElmoModel
    from hf_elmo.hub_elmo import render_model_card

    folder = converted_dirs["allennlp"]
    from hf_elmo import ElmoForQuestionAnswering

    classes = [(ElmoModel, "feature-extraction"), (ElmoForSequenceClassification, "text-classification")]
    for cls, tag in classes + [(ElmoForQuestionAnswering, "question-answering")]:
        card = render_model_card(cls.from_pretrained(folder), "org/name", license="mit")
        assert card.data.pipeline_tag == tag and card.data.license == "mit"
        assert "org/name" in card.text and "@inproceedings{peters-etal-2018-deep" in card.text


def test_question_answering_push_to_hub_then_pipeline_by_repo_id_without_the_package(
    converted_dirs, tmp_path, monkeypatch
):
    from transformers import AutoModelForQuestionAnswering

    from hf_elmo import ElmoQuestionAnsweringPipeline

    FakeHub(tmp_path / "hub-cache").install(monkeypatch)
    folder = converted_dirs["allennlp"]
    torch.manual_seed(0)
    model = AutoModelForQuestionAnswering.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.push_to_hub("org/elmo-qa")
    model.push_to_hub("org/elmo-qa")
    question, context = "Who sat on the mat?", "The cat sat on the mat."
    expected = ElmoQuestionAnsweringPipeline(model=model, tokenizer=tokenizer)(question=question, context=context)
    script = textwrap.dedent(
        f"""
        import json
        from transformers import pipeline
        qa = pipeline("question-answering", model="org/elmo-qa", trust_remote_code=True)
        assert type(qa).__module__.startswith("transformers_modules"), type(qa).__module__
        json.dump(qa(question={question!r}, context={context!r}), open("answer.json", "w"))
        """
    )
    run_without_hf_elmo(script, tmp_path, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub-cache"))
    answer = json.loads((tmp_path / "answer.json").read_text())
    assert answer == {**expected, "score": answer["score"]} and abs(answer["score"] - expected["score"]) < 1e-6
