"""Pushing ELMo models to the Hub with the ELMo model card (`model_card.md`) as the repository README."""

import tempfile
from pathlib import Path

from huggingface_hub import HfApi, ModelCard, ModelCardData
from huggingface_hub.errors import EntryNotFoundError

# The project's top-level model_card.md, linked into the package so installed copies carry it.
MODEL_CARD_TEMPLATE = Path(__file__).with_name("model_card.md")
PIPELINE_TAGS = {
    "ElmoForSequenceClassification": "text-classification",
    "ElmoForTokenClassification": "token-classification",
    "ElmoForQuestionAnswering": "question-answering",
}
# The placeholder card transformers uploads when a repository has none (e.g. after tokenizer.push_to_hub).
_TRANSFORMERS_PLACEHOLDER = "This model card has been automatically generated."


def render_model_card(
    model, repo_id: str, datasets: list[str] | None = None, license: str = "apache-2.0", tags: list[str] | None = None
) -> ModelCard:
    """The ELMo model card for `model` published as `repo_id`.

    The template is `model_card.md` beside this file; code loaded from a saved folder has no template and gets
    huggingface_hub's default card with the same metadata.
    """
    model_class = type(model).__name__
    card_data = ModelCardData(
        library_name="transformers",
        license=license,
        tags=["elmo", "hf-elmo", "custom_code", *(tags or [])],
        pipeline_tag=PIPELINE_TAGS.get(model_class, "feature-extraction"),
        datasets=datasets,
    )
    config = model.config
    template_kwargs = dict(
        repo_id=repo_id,
        model_class=model_class,
        labels=list(config.id2label.values()) if model_class in PIPELINE_TAGS else None,
        num_layers=config.num_layers,
        projection_dim=config.projection_dim,
        cell_dim=config.cell_dim,
        num_parameters=model.num_parameters(),
    )
    if MODEL_CARD_TEMPLATE.is_file():
        return ModelCard.from_template(card_data, template_path=str(MODEL_CARD_TEMPLATE), **template_kwargs)
    return ModelCard.from_template(card_data, model_id=repo_id)


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
    """`model.save_pretrained` (weights, config, remote code) uploaded in one commit with a README: the repository's
    own card if it has one (tags added), else the ELMo model card. Returns the `CommitInfo`."""
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


__all__ = ["push_to_hub_with_model_card", "render_model_card"]
