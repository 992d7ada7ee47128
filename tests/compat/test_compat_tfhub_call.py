"""`TFHubElmo`'s call as TF-Hub's `hub.Module` call: `default` alone unless `as_dict=True`, `signature` `None` or
"default" for strings and "tokens" for `{"tokens", "sequence_len"}`; the migration guide's "after" block runs."""

import re
from pathlib import Path

import pytest
import torch

from hf_elmo.compat.tfhub import TFHubElmo

MIGRATION = Path(__file__).resolve().parents[2] / "docs" / "migration.md"


@pytest.fixture(scope="module")
def hub_elmo(converted_dirs):
    return TFHubElmo(str(converted_dirs["allennlp"]))


def test_the_call_returns_default_unless_as_dict(hub_elmo):
    strings = ["the cat is on the mat", "hi"]
    everything = hub_elmo(strings, signature="default", as_dict=True)
    assert set(everything) == {"word_emb", "lstm_outputs1", "lstm_outputs2", "elmo", "default"}
    for call in (hub_elmo(strings), hub_elmo(strings, signature="default"), hub_elmo(inputs=strings, as_dict=False)):
        assert isinstance(call, torch.Tensor)
        torch.testing.assert_close(call, everything["default"], rtol=0, atol=0)
    tokens = {"tokens": [["the", "cat", "is", "on", "the", "mat"], ["hi", "", "", "", "", ""]], "sequence_len": [6, 1]}
    from_tokens = hub_elmo(inputs=tokens, signature="tokens")
    torch.testing.assert_close(from_tokens, everything["default"], rtol=0, atol=0)
    torch.testing.assert_close(
        hub_elmo(tokens=tokens["tokens"], sequence_len=tokens["sequence_len"]), from_tokens, rtol=0, atol=0
    )


def test_token_inputs_under_the_default_signature_are_a_one_line_error(hub_elmo):
    # A dict iterated as strings would embed its keys: refused, naming the signature to use.
    with pytest.raises(ValueError, match='needs signature="tokens"') as error:
        hub_elmo(inputs={"tokens": [["a"]], "sequence_len": [1]})
    assert "\n" not in str(error.value)


def test_the_migration_guides_after_block_runs_with_its_before_lines(converted_dirs):
    section = MIGRATION.read_text(encoding="utf-8").split("## TF-Hub ELMo", 1)[1].split("\n## ", 1)[0]
    before, after = re.findall(r"```python\n(.*?)```", section, flags=re.S)[:2]
    calls = [line for line in before.splitlines() if line.startswith(("out", "vectors", "embeddings"))]
    assert calls and all(line in after for line in calls), "the calls themselves do not change"
    code = after.replace('"path/to/converted-elmo"', repr(str(converted_dirs["allennlp"])))
    scope = {"tokens": [["the", "cat"], ["hi", ""]], "lengths": [2, 1]}
    exec(compile(code, str(MIGRATION), "exec"), scope)
    assert isinstance(scope["vectors"], torch.Tensor) and scope["vectors"].shape == (1, 32)
    assert set(scope["out"]) == {"word_emb", "lstm_outputs1", "lstm_outputs2", "elmo", "default"}
