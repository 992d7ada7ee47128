"""The ELMo model card (`model_card.md`): written into every folder `save_pretrained` writes (`write_model_card`) and
pushed to the Hub as the repository README.

The card tells what the folder holds (class, task, labels in id order, sizes) and how it was made, from the history a
model's config carries (`config.json` `elmo_origin`, added to by `model_io.add_origin`): converted by `hf-elmo
convert`, trained by `hf-elmo train`, a task head put on the biLM of a named folder or repository; and the
evaluation the model's config records (`elmo_evaluation`: the held-out perplexity `hf-elmo train` logged).

The model reaches this module only through the installed package (`pretrained_elmo.installed_hub_module`): a saved
folder's remote code carries no Hub code.
"""

import json
import tempfile
from pathlib import Path

from huggingface_hub import HfApi, ModelCard, ModelCardData
from huggingface_hub.errors import EntryNotFoundError

from ..configuration_elmo import model_class_entry
from ..folder_files import write_atomically
from ..io.files import CARD_MARKER
from ..pretrained_elmo import TOKENIZER_CONFIG

# The project's top-level model_card.md, linked into the package so installed copies carry it.
MODEL_CARD_TEMPLATE = Path(__file__).with_name("model_card.md")
# The task heads' options the card's snippets show for a folder without such a head: examples, not the defaults.
_TAGGER_EXAMPLE = dict(
    num_labels=17,
    task_encoder_hidden_size=64,
    elmo_placement=["input", "output"],
    scalar_mix_layers=None,
    scalar_mix_trainable=True,
    scalar_mix_layer_norm=False,
    scalar_mix_l2=0.0,
    elmo_dropout=0.5,
    word_vectors_size=0,
    word_vectors_dim=0,
)
_CLASSIFIER_EXAMPLE = dict(num_labels=3, classifier_pooling="mean_max", sentence_pairs=False)
# The placeholder card transformers uploads when a repository has none (e.g. after tokenizer.push_to_hub).
_TRANSFORMERS_PLACEHOLDER = "This model card has been automatically generated."


def write_model_card(model, save_directory):
    """Writes the card of `model` as `save_directory/README.md`, unless a README.md there is not one this function
    wrote (see `CARD_MARKER`), or the template is missing (the folder's copy of this code loaded as remote code)."""
    readme = Path(save_directory) / "README.md"
    if not MODEL_CARD_TEMPLATE.is_file():
        return
    if readme.exists() and CARD_MARKER not in readme.read_text(encoding="utf-8", errors="replace"):
        return
    # No name: commands write into a temporary folder that is renamed when complete.
    card = render_model_card(model, None, marker=CARD_MARKER)
    write_atomically(readme, str(card))


def render_model_card(
    model,
    repo_id: str | None,
    datasets: list[str] | None = None,
    license: str = "apache-2.0",
    tags: list[str] | None = None,
    marker: str = "",
) -> ModelCard:
    """The ELMo model card for `model` published as `repo_id` (`None` for a folder: its usage examples then say
    "path/to/this/folder").

    The template is `model_card.md` beside this file; code loaded from a saved folder has no template and gets
    huggingface_hub's default card with the same metadata.
    """
    model_class = type(model).__name__
    card_data = ModelCardData(
        library_name="transformers",
        license=license,
        tags=["elmo", "hf-elmo", "custom_code", *(tags or [])],
        pipeline_tag=model_class_entry(type(model)).pipeline_task,
        datasets=datasets,
    )
    config = model.config
    template_kwargs = dict(
        marker=marker,
        repo_id=repo_id,
        model_class=model_class,
        auto_class=model_class_entry(type(model)).auto_class,
        tagger=_head_options(config, _TAGGER_EXAMPLE, model_class == "ElmoForTokenClassification"),
        classifier=_head_options(config, _CLASSIFIER_EXAMPLE, model_class == "ElmoForSequenceClassification"),
        task=card_data.pipeline_tag,
        labels=[config.id2label[i] for i in sorted(config.id2label)] if model.has_classifier else None,
        num_layers=config.num_layers,
        projection_dim=config.projection_dim,
        cell_dim=config.cell_dim,
        max_characters_per_token=config.max_characters_per_token,
        num_parameters=model.num_parameters(),
        origin=getattr(config, "elmo_origin", None) or [],
        evaluation=getattr(config, "elmo_evaluation", None) or [],
        freeze_elmo=config.freeze_elmo,
        sentence_pairs=config.sentence_pairs,
        warm_state=config.warm_state,
    )
    if MODEL_CARD_TEMPLATE.is_file():
        return ModelCard.from_template(card_data, template_path=str(MODEL_CARD_TEMPLATE), **template_kwargs)
    return ModelCard.from_template(card_data, model_id=repo_id)


def _head_options(config, example: dict, own_class: bool) -> dict:
    """The options a card's head snippet passes, as Python source (the number of labels as an int): the folder's own
    values for the folder's own class, so that its head loads as saved, else `example`."""
    values = {name: getattr(config, name) for name in example} if own_class else example
    source = {
        name: json.dumps(value) if isinstance(value, (str, list)) else repr(value) for name, value in values.items()
    }
    return {**source, "num_labels": values["num_labels"]}


def push_to_hub_with_model_card(
    model,
    repo_id: str,
    *,
    commit_message: str | None = None,
    commit_description: str | None = None,
    private: bool | None = None,
    token: bool | str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    max_shard_size: int | str | None = "50GB",
    tags: list[str] | None = None,
    datasets: list[str] | None = None,
    license: str = "apache-2.0",
):
    """`model.save_pretrained` (weights, config, remote code, tokenizer) uploaded in one commit with a README: the
    repository's own card if it has one (tags added), else the ELMo model card; the repository's own tokenizer
    configuration if it has one (pushed before, maybe with added tokens), else the model's. Returns the
    `CommitInfo`."""
    api = HfApi()
    repo_id = api.create_repo(repo_id, private=private, token=token, exist_ok=True).repo_id
    try:
        card = ModelCard.load(repo_id, token=token)
        if _TRANSFORMERS_PLACEHOLDER in card.text:
            card = render_model_card(model, repo_id, datasets=datasets, license=license, tags=tags)
        else:
            card.data.tags = list(dict.fromkeys([*(card.data.tags or []), *(tags or [])]))
    except EntryNotFoundError:
        card = render_model_card(model, repo_id, datasets=datasets, license=license, tags=tags)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder, max_shard_size=max_shard_size)
        if TOKENIZER_CONFIG in api.list_repo_files(repo_id, token=token, revision=revision):
            (Path(folder) / TOKENIZER_CONFIG).unlink(missing_ok=True)  # the repository's own tokenizer stays
        card.save(Path(folder) / "README.md")
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            commit_message=commit_message or "Upload model",
            commit_description=commit_description,
            token=token,
            revision=revision,
            create_pr=create_pr,
        )


__all__ = [
    "push_to_hub_with_model_card",
    "render_model_card",
    "write_model_card",
]
