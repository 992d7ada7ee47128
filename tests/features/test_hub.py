"""push_to_hub and Trainer(push_to_hub=True) against a faked Hub (see fake_hub.py for what it does not cover), then
loading by repo id in a fresh, offline process where hf_elmo cannot be imported: the remote-code path users get."""

import json
import textwrap

import numpy as np
import torch
from conftest import as_a_folder_copy_runs, run_without_hf_elmo
from fake_hub import FakeHub
from huggingface_hub import ModelCard
from transformers import AutoModelForTokenClassification, AutoTokenizer, Trainer, TrainingArguments

from hf_elmo.features.task_data import DataCollatorForElmo, tokenize_and_align_labels

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
    with torch.no_grad(), as_a_folder_copy_runs(model):
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
        "character_rows.py",
        "scalar_mix.py",
        "sampled_softmax.py",
        "pipelines_elmo.py",
        "tokenization_elmo.py",
    }
    assert code | {"config.json", "model.safetensors", "tokenizer_config.json", "README.md"} <= files
    assert not {"hub.py", "files.py", "cli.py"} & files
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


# Twelve labels, so that string order of the ids ("0", "1", "10", "11", "2", ...) differs from id order.
MANY_LABELS = {i: f"TAG{i}" for i in range(12)}


def card_labels(text):
    """The labels a card lists, in its order."""
    listed = text.split("labels in id order (", 1)[1].split(")", 1)[0]
    return [label.strip(" `\n") for label in listed.split(",")]


def card_origin(text):
    """The bullet points of the card's "How this model was made" section, each as one line."""
    bullets = text.split("## How this model was made", 1)[1].strip().split("\n\n", 1)[0]
    return [" ".join(item.split()) for item in ("\n" + bullets).split("\n* ")[1:]]


def test_model_card_for_each_class(converted_dirs):
    from hf_elmo import ElmoForSequenceClassification, ElmoForTokenClassification, ElmoModel
    from hf_elmo.features.hub import render_model_card

    folder = converted_dirs["allennlp"]
    from hf_elmo import ElmoForQuestionAnswering

    for cls, tag in [
        (ElmoModel, "feature-extraction"),
        (ElmoForSequenceClassification, "text-classification"),
        (ElmoForTokenClassification, "token-classification"),
        (ElmoForQuestionAnswering, "question-answering"),
    ]:
        options = {} if cls in (ElmoModel, ElmoForQuestionAnswering) else {"id2label": MANY_LABELS}
        card = render_model_card(cls.from_pretrained(folder, **options), "org/name", license="mit")
        assert card.data.pipeline_tag == tag and card.data.license == "mit"
        assert "org/name" in card.text and "@inproceedings{peters-etal-2018-deep" in card.text
        assert f"Class `{cls.__name__}` (task: {tag})" in card.text
        if options:
            assert card_labels(card.text) == [MANY_LABELS[i] for i in range(12)]
        # What the card says it came from is what happened to it; it holds no results (no table, no accuracy).
        assert card_origin(card.text)[0] == (
            "Converted by `hf-elmo convert` from an original bilm-tf / AllenNLP model (`options.json`, "
            "`lm_weights.hdf5`)."
        )
        assert "|" not in card.text and "%" not in card.text and "accuracy" not in card.text.lower()


def test_every_saved_folder_carries_its_card(converted_dirs, tmp_path):
    from hf_elmo import ElmoForTokenClassification
    from hf_elmo.io.files import CARD_MARKER

    converted = converted_dirs["allennlp"]
    card = ModelCard.load(converted / "README.md")
    assert card.data.pipeline_tag == "feature-extraction" and card.text.lstrip().startswith(CARD_MARKER)
    assert card_origin(card.text)[0].startswith("Converted by `hf-elmo convert` from an original bilm-tf")
    # convert writes into a temporary folder renamed when complete: the card names no folder
    assert "\n# ELMo\n" in card.text and 'from_pretrained("path/to/this/folder"' in card.text

    torch.manual_seed(0)
    model = ElmoForTokenClassification.from_pretrained(converted, id2label=MANY_LABELS)
    tokenizer = AutoTokenizer.from_pretrained(converted)
    label2id = {v: k for k, v in MANY_LABELS.items()}
    tags = [[f"TAG{(3 * i + len(words)) % 12}" for i in range(len(words))] for words in WORDS]
    encoded = tokenize_and_align_labels(tokenizer, WORDS, tags, label2id=label2id)
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=1,
        per_device_train_batch_size=2,
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        save_strategy="no",
    )
    trainer = Trainer(
        model=model,
        args=args,
        data_collator=DataCollatorForElmo(tokenizer),
        train_dataset=[{key: encoded[key][i] for key in encoded} for i in range(len(WORDS))],
    )
    trainer.train()
    trainer.save_model(str(tmp_path / "tagger"))
    card = ModelCard.load(tmp_path / "tagger" / "README.md")
    assert card.data.pipeline_tag == "token-classification" and "Class `ElmoForTokenClassification`" in card.text
    assert card_labels(card.text) == [MANY_LABELS[i] for i in range(12)]
    history = card_origin(card.text)
    assert history[:2] == [
        card_origin(ModelCard.load(converted / "README.md").text)[0],
        f"`ElmoForTokenClassification` head put on the biLM of the folder `{converted.name}`.",
    ]
    assert "`freeze_elmo=True`" in history[2]

    # Loaded back and saved again, the head has the same history; a README.md someone else wrote is left alone, one
    # this package wrote is written again.
    again = ElmoForTokenClassification.from_pretrained(tmp_path / "tagger")
    again.save_pretrained(tmp_path / "again")
    assert card_origin(ModelCard.load(tmp_path / "again" / "README.md").text) == history
    (tmp_path / "again" / "README.md").write_text("# My tagger\n", encoding="utf-8")
    again.save_pretrained(tmp_path / "again")
    assert (tmp_path / "again" / "README.md").read_text(encoding="utf-8") == "# My tagger\n"


def test_a_converted_training_checkpoint_card_names_its_source(checkpoint_dir):
    from conftest import CHECKPOINT

    words = [line for line in (CHECKPOINT / "vocab.txt").read_text(encoding="utf-8").splitlines() if line]
    card = ModelCard.load(checkpoint_dir / "README.md")
    assert card.data.pipeline_tag == "feature-extraction" and "Class `ElmoForBiLM`" in card.text
    assert card_origin(card.text) == [
        f"Converted by `hf-elmo convert` from the bilm-tf training checkpoint `tf_checkpoint`, with its softmax and "
        f"the {len(words):,}-word vocabulary `vocab.txt`."
    ]


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
