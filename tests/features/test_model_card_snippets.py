"""The model card's code runs on the folder it describes, for every class (a tagger with its own label count, a
pair classifier, heads with their own options), and `hf-elmo train`'s card reports the held-out perplexity the run
logged."""

import re

import pytest
from huggingface_hub import ModelCard
from test_training import one_thread  # noqa: F401  (an autouse fixture)
from test_training_stream import corpus, options  # noqa: F401  (a fixture)

from hf_elmo import (
    ElmoConfig,
    ElmoForBiLM,
    ElmoForQuestionAnswering,
    ElmoForSequenceClassification,
    ElmoForTokenClassification,
    ElmoModel,
    ElmoTokenizer,
)
from hf_elmo.commands.train import train_bilm

FOLDERS = {
    "encoder": (ElmoModel, {}),
    "bilm": (ElmoForBiLM, {"vocab_size": 20}),
    # Not the card's example count, and a task encoder, word vectors and both placements of its own.
    "tagger": (
        ElmoForTokenClassification,
        {
            "num_labels": 31,
            "task_encoder_hidden_size": 8,
            "elmo_placement": ["input", "output"],
            "word_vectors_size": 10,
            "word_vectors_dim": 4,
        },
    ),
    "classifier": (ElmoForSequenceClassification, {"num_labels": 2, "classifier_pooling": "max"}),
    "pair-classifier": (ElmoForSequenceClassification, {"num_labels": 4, "sentence_pairs": True}),
    "question-answering": (ElmoForQuestionAnswering, {}),
}


def card_code(folder) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (folder / "README.md").read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.parametrize("name", FOLDERS)
def test_each_cards_code_runs_on_its_folder(name, tmp_path):
    model_class, fields = FOLDERS[name]
    folder = tmp_path / name
    model_class(ElmoConfig.from_preset("tiny", **fields)).save_pretrained(folder)
    ElmoTokenizer().save_pretrained(folder)
    blocks = card_code(folder)
    assert len(blocks) >= 2 and all("path/to/this/folder" in block for block in blocks)
    scope = {}
    for block in blocks:  # in order: later blocks use the tokenizer and batch of the first
        exec(compile(block.replace("path/to/this/folder", str(folder)), f"{name}/README.md", "exec"), scope)
    if name in ("tagger", "classifier", "pair-classifier"):
        head = scope["tagger" if name == "tagger" else "classifier"]
        assert head.config.num_labels == fields["num_labels"]
        saved = model_class.from_pretrained(folder)
        assert all(value.equal(saved.state_dict()[key]) for key, value in head.state_dict().items()), (
            "the head of the folder's own class loads as saved"
        )


def test_a_trained_bilms_card_reports_the_held_out_perplexity_the_run_logged(corpus, tmp_path, capsys):  # noqa: F811
    held_out = corpus / "shards" / "b.txt"
    metrics = train_bilm(**options(corpus, tmp_path / "run", eval_files=[held_out], eval_steps=3))
    logged = re.search(r"^Held-out perplexity: (.*)\.$", capsys.readouterr().out, re.M).group(1)
    assert logged == (
        f"forward {metrics['eval_forward_perplexity']:.2f}, backward {metrics['eval_backward_perplexity']:.2f}, "
        f"geometric mean {metrics['eval_perplexity']:.2f}"
    )
    card = ModelCard.load(tmp_path / "run" / "README.md").text
    evaluation = " ".join(card.split("## Evaluation", 1)[1].split("\n## ", 1)[0].split())
    assert evaluation == (
        f"* Held-out perplexity of the biLM at the end of its `hf-elmo train` run (step {metrics['steps']}, `b.txt` "
        f"in windows of 10 positions): {logged}."
    )
    # A run from its weights trains another biLM: the card does not carry the earlier one's evaluation.
    again = options(corpus, tmp_path / "again", init_from=str(tmp_path / "run"), config=None, max_steps=3)
    train_bilm(**again)
    assert "reports no evaluation" in ModelCard.load(tmp_path / "again" / "README.md").text
