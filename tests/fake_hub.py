"""An in-process stand-in for the Hub's write API, for tests without network.

Commits are written into a real Hugging Face cache layout (`models--org--name/snapshots/<sha>/`, `refs/main`), so a
fresh process with `HF_HUB_OFFLINE=1` and `HF_HUB_CACHE` pointing there loads the repositories by id through the real
download and remote-code paths. Not covered: authentication, large-file (LFS/Xet) uploads (upload_folder is sent down
its single-commit path) and the server's own checks; the README's YAML is only parsed locally.
"""

import hashlib
import shutil
from concurrent.futures import Future
from pathlib import Path

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, ModelCard, hf_api
from huggingface_hub.errors import EntryNotFoundError
from huggingface_hub.hf_api import CommitInfo, RepoUrl

ENDPOINT = "https://huggingface.co"


class FakeHub:
    def __init__(self, cache_dir: Path, user: str = "fake-user"):
        self.cache_dir = Path(cache_dir)
        self.user = user
        self.commits: list[tuple[str, str, list[str]]] = []  # (repo id, message, files after the commit)

    def install(self, monkeypatch):
        hub = self
        original_load = ModelCard.load.__func__

        def create_repo(api, repo_id, *args, **kwargs):
            repo_id = repo_id if "/" in repo_id else f"{hub.user}/{repo_id}"
            (hub._repo_dir(repo_id) / "refs").mkdir(parents=True, exist_ok=True)
            return RepoUrl(f"{ENDPOINT}/{repo_id}", endpoint=ENDPOINT)

        def create_commit(api, repo_id, operations, *, commit_message, run_as_future=False, **kwargs):
            info = hub._commit(repo_id, list(operations), commit_message)
            if run_as_future:
                future = Future()
                future.set_result(info)
                return future
            return info

        def validate_yaml(api, content, *args, **kwargs):
            ModelCard(content, ignore_metadata_errors=False)  # the server's check, approximated by parsing locally

        def list_repo_files(api, repo_id, *args, **kwargs):
            snapshot = hub.snapshot(repo_id)
            return (
                []
                if snapshot is None
                else sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
            )

        def load_card(cls, repo_id_or_path, *args, **kwargs):
            if Path(repo_id_or_path).exists():
                return original_load(cls, repo_id_or_path, *args, **kwargs)
            snapshot = hub.snapshot(str(repo_id_or_path))
            if snapshot is None or not (snapshot / "README.md").is_file():
                raise EntryNotFoundError(f"{repo_id_or_path} has no README.md")
            return original_load(cls, snapshot / "README.md", *args, **kwargs)

        monkeypatch.setattr(HfApi, "create_repo", create_repo)
        monkeypatch.setattr(HfApi, "create_commit", create_commit)
        monkeypatch.setattr(HfApi, "list_repo_files", list_repo_files)
        monkeypatch.setattr(HfApi, "_validate_yaml", validate_yaml)
        # upload_folder's pipelined (Xet) path talks to the server directly; the single-commit path uses create_commit.
        monkeypatch.setattr(hf_api, "is_xet_available", lambda: False)
        monkeypatch.setattr(ModelCard, "load", classmethod(load_card))
        return self

    def _repo_dir(self, repo_id: str) -> Path:
        return self.cache_dir / f"models--{repo_id.replace('/', '--')}"

    def snapshot(self, repo_id: str) -> Path | None:
        """Folder of the repository's current files, or None before its first commit."""
        ref = self._repo_dir(repo_id) / "refs/main"
        return self._repo_dir(repo_id) / "snapshots" / ref.read_text() if ref.is_file() else None

    def _commit(self, repo_id: str, operations: list, message: str) -> CommitInfo:
        previous = self.snapshot(repo_id)
        contents = {}
        for op in operations:
            if isinstance(op, CommitOperationAdd):
                with op.as_file() as file:
                    contents[op.path_in_repo] = file.read()
        if "README.md" in contents:
            HfApi._validate_yaml(None, contents["README.md"].decode("utf-8"))
        digest = hashlib.sha1(f"{previous}{message}{len(self.commits)}".encode())
        for path in sorted(contents):
            digest.update(path.encode() + contents[path])
        sha = digest.hexdigest()
        snapshot = self._repo_dir(repo_id) / "snapshots" / sha
        if previous is not None:
            shutil.copytree(previous, snapshot)
        snapshot.mkdir(parents=True, exist_ok=True)
        for op in operations:
            if isinstance(op, CommitOperationDelete):
                target = snapshot / op.path_in_repo
                shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        for path, data in contents.items():
            (snapshot / path).parent.mkdir(parents=True, exist_ok=True)
            (snapshot / path).write_bytes(data)
        (self._repo_dir(repo_id) / "refs").mkdir(parents=True, exist_ok=True)
        (self._repo_dir(repo_id) / "refs/main").write_text(sha)
        files = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
        self.commits.append((repo_id, message, files))
        return CommitInfo(
            commit_url=f"{ENDPOINT}/{repo_id}/commit/{sha}", commit_message=message, commit_description="", oid=sha
        )
