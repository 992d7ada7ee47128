"""`ElmoPaths` and `resolve`: the rules that turn "auto" into a named path, the names each field allows, where the
paths live (`config.paths`, `from_pretrained(..., paths=...)`) and what `model.paths` shows."""

import json
import re

import pytest
import torch

from hf_elmo import ElmoConfig, ElmoModel, ElmoPaths, compute_paths, paths_resolution
from hf_elmo.compute_paths import CHOICES
from hf_elmo.paths_resolution import resolve

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
F32, BF16, F64 = torch.float32, torch.bfloat16, torch.float64

# What "auto" resolves to on each machine: (device, dtype, training, capturing, compiled loops built, Triton runs on the
# device) -> the fields that differ from `CPU_INFERENCE`.
CPU_INFERENCE = {
    "char_cnn": "distinct_words",
    "window_max": "compiled",
    "highway": "torch",
    "lstm": "sorted",
    "lstm_kernels": "compiled",
    "joint_input_product": "by_batch_size",
    "cuda_graphs": "off",
    "linear": "onednn",
    "dropout": "torch",
    "threads": "concurrent",
}
GPU = {
    "char_cnn": "every_word",
    "window_max": "torch",
    "highway": "triton",
    "lstm": "static",
    "lstm_kernels": "triton",
    "cuda_graphs": "on",
    "linear": "torch",
    "threads": "single",
}
NO_LOOPS = {"window_max": "torch", "lstm_kernels": "torch"}
RULES = [
    ((CPU, F32, False, None, True, False), {}),
    ((CPU, F32, True, None, True, False), dict(dropout="compiled", threads="single")),
    # No compiled loops: PyTorch's operations everywhere they would run.
    ((CPU, F32, True, None, False, False), dict(window_max="torch", lstm_kernels="torch", threads="single")),
    # The compiled loops are float32 only (also under bfloat16 autocast, which resolves with its dtype).
    ((CPU, BF16, True, None, True, False), {**NO_LOOPS, "threads": "single"}),
    ((CPU, F64, False, None, True, False), dict(window_max="torch", lstm_kernels="torch")),
    # Triton under its interpreter on CPU tensors (the test suite): kernels only where asked for.
    ((CPU, F32, False, None, True, True), {}),
    ((CUDA, F32, False, None, False, True), GPU),
    ((CUDA, F32, True, None, False, True), GPU),
    ((CUDA, BF16, True, None, False, True), {**GPU, "window_max": "triton"}),
    ((CUDA, torch.float16, False, None, False, True), {**GPU, "window_max": "triton"}),
    # While a CUDA graph is captured: the fused window products for float32 too, no graphs inside the graph.
    ((CUDA, F32, True, "cuda_graph", False, True), {**GPU, "cuda_graphs": "off"}),
    # A GPU without Triton: PyTorch's operations.
    ((CUDA, BF16, False, None, False, False), {**GPU, "highway": "torch", "lstm_kernels": "torch"}),
    # torch.export and torch.compile: the reference, whatever was asked for.
    ((CPU, F32, False, "export", True, False), ElmoPaths.reference().to_dict()),
    ((CUDA, BF16, True, "export", False, True), ElmoPaths.reference().to_dict()),
]


@pytest.fixture
def machine(monkeypatch):
    """Sets whether the compiled loops are built and whether Triton runs on CPU tensors (its interpreter)."""

    def set_machine(loops: bool, triton_runs: bool, device: torch.device, packed: bool = False):
        monkeypatch.setattr(paths_resolution, "loops_built", lambda: loops)
        monkeypatch.setattr(paths_resolution, "packed_products_built", lambda: packed)
        monkeypatch.setattr(paths_resolution, "triton", object() if triton_runs else None)
        monkeypatch.setattr(paths_resolution, "INTERPRETED", triton_runs and device.type == "cpu")

    return set_machine


@pytest.mark.parametrize("case, expected", RULES, ids=[str(k) for k in range(len(RULES))])
def test_auto_resolves_by_the_rules(case, expected, machine):
    device, dtype, training, capturing, loops, triton_runs = case
    machine(loops, triton_runs, device)
    resolved = resolve(ElmoPaths(), device, dtype, training, capturing)
    assert resolved.to_dict() == {**CPU_INFERENCE, **expected}
    assert "auto" not in resolved.to_dict().values()


def test_named_paths_are_kept_and_the_reference_ignores_the_kernels_of_the_others(machine):
    machine(True, False, CPU)
    chosen = dict(char_cnn="every_word", window_max="torch", lstm="static", lstm_kernels="torch", threads="single")
    assert resolve(ElmoPaths(**chosen), CPU, F32, False).to_dict() == {**CPU_INFERENCE, **chosen}
    # The reference character CNN has no window max or highway kernel to choose; a reference LSTM no step kernels.
    resolved = resolve(ElmoPaths(char_cnn="reference", lstm="reference"), CPU, F32, False)
    assert (resolved.window_max, resolved.highway, resolved.lstm_kernels) == ("torch", "torch", "torch")


@pytest.mark.parametrize("field", list(CHOICES))
def test_a_name_out_of_the_allowed_set_is_refused_naming_the_field_and_the_values(field):
    allowed = ("auto", *CHOICES[field])
    with pytest.raises(ValueError, match=rf"^paths\.{field} must be one of {re.escape(repr(allowed))}, got 'fast'\.$"):
        ElmoPaths(**{field: "fast"})
    with pytest.raises(ValueError, match=rf"^paths\.{field} must be one of"):
        ElmoConfig(paths={field: "fast"})
    for value in allowed:
        assert getattr(ElmoPaths(**{field: value}), field) == value


@pytest.mark.parametrize(
    "chosen, loops, message",
    [
        (dict(lstm="static", lstm_kernels="compiled"), True, r"^paths\.lstm_kernels='compiled' runs on paths\.lstm="),
        (dict(lstm="sorted", lstm_kernels="triton_fused"), True, r"^paths\.lstm_kernels='triton_fused' needs Triton"),
        (dict(dropout="compiled"), False, r"^paths\.dropout='compiled' needs the compiled CPU loops"),
        (dict(highway="triton"), True, r"^paths\.highway='triton' needs Triton and CUDA tensors"),
    ],
)
def test_a_path_that_cannot_run_here_is_refused(chosen, loops, message, machine):
    machine(loops, False, CPU)
    with pytest.raises(ValueError, match=message):
        resolve(ElmoPaths(**chosen), CPU, F32, True)


def test_capturing_must_name_what_captures():
    with pytest.raises(ValueError, match=r"^capturing must be one of \(None, 'cuda_graph', 'export'\), got True\.$"):
        resolve(ElmoPaths(), CPU, F32, False, True)


def test_printed_one_line_per_field():
    lines = str(ElmoPaths.reference()).splitlines()
    assert lines == [f"{field}: {ElmoPaths.reference().to_dict()[field]}" for field in CHOICES]


TINY = dict(char_embedding_dim=4, filters=[[1, 4], [2, 4]], n_highway=1, cell_dim=8, projection_dim=4, num_layers=1)


def tiny_config(**overrides):
    return ElmoConfig(**TINY, **overrides)


def test_the_config_holds_the_paths_as_a_dict_and_from_pretrained_sets_them(tmp_path):
    assert tiny_config().paths == {field: "auto" for field in CHOICES}
    assert tiny_config(paths=ElmoPaths(lstm="reference")).paths["lstm"] == "reference"
    config = tiny_config()
    config.paths = ElmoPaths(lstm="sorted")  # set later: still a dict for config.json
    assert json.loads(config.to_json_string())["paths"]["lstm"] == "sorted"
    ElmoModel(tiny_config(paths={"lstm": "static"})).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())["paths"]
    assert saved == {**{field: "auto" for field in CHOICES}, "lstm": "static"}
    model = ElmoModel.from_pretrained(tmp_path, paths={"lstm": "reference", "char_cnn": "every_word"})
    assert model.paths.lstm == "reference" and model.paths.char_cnn == "every_word"
    assert ElmoModel.from_pretrained(tmp_path).paths.lstm == "static"


def test_model_paths_show_what_runs(machine):
    """`model.paths` is the resolution for the model's device, dtype and mode; the reference runs the plain math."""
    machine(True, False, CPU)
    model = ElmoModel(tiny_config()).eval()
    assert model.paths == resolve(ElmoPaths(), CPU, F32, False)
    assert model.train().paths.dropout == "compiled"
    model.config.paths = ElmoPaths.reference().to_dict()
    assert model.paths == ElmoPaths.reference()


def test_large_lstm_steps_resolve_to_pytorchs_and_print_why(machine):
    machine(True, False, CPU)
    limit = compute_paths.MAX_COMPILED_STEP_MULTIPLY_ADDS
    assert resolve(ElmoPaths(), CPU, F32, True, step_multiply_adds=limit - 1).lstm_kernels == "compiled"
    large = resolve(ElmoPaths(), CPU, F32, True, step_multiply_adds=limit)
    assert large.lstm_kernels == "torch"
    assert f"lstm_kernels: torch (steps of at least {limit:,} multiply-adds per row" in str(large)
    assert resolve(ElmoPaths(lstm_kernels="compiled"), CPU, F32, True, step_multiply_adds=limit).lstm_kernels == (
        "compiled"
    )
    assert resolve(ElmoPaths(), CPU, F32, False, step_multiply_adds=limit).lstm_kernels == "torch"


def test_large_lstm_steps_at_inference_run_compiled_where_the_loops_pack_their_weights(machine):
    machine(True, False, CPU, packed=True)
    limit = compute_paths.MAX_COMPILED_STEP_MULTIPLY_ADDS
    assert resolve(ElmoPaths(), CPU, F32, False, step_multiply_adds=limit).lstm_kernels == "compiled"
    training = resolve(ElmoPaths(), CPU, F32, True, step_multiply_adds=limit)
    assert training.lstm_kernels == "torch"
    assert (
        f"lstm_kernels: torch (steps of at least {limit:,} multiply-adds per row run faster in PyTorch in training)"
        in (str(training))
    )


def test_onednn_needs_cpu_tensors_and_prints_the_products_it_takes(machine):
    machine(True, False, CPU)
    products = compute_paths.onednn_products()
    assert f"linear: onednn ({products})" in str(resolve(ElmoPaths(), CPU, F32, False)).splitlines()
    assert resolve(ElmoPaths(linear="torch"), CPU, F32, False).onednn is None
    with pytest.raises(ValueError, match=r"^paths\.linear='onednn' needs CPU tensors; got torch\.float32 .* cuda\.$"):
        resolve(ElmoPaths(linear="onednn"), CUDA, F32, False)


BATCH_THAT_CAPTURES = dict(
    labels=True,
    outputs_beyond_loss=False,
    carried=True,
    state_takes_gradients=False,
    gradient_checkpointing=False,
    positions_per_direction=compute_paths.MAX_CAPTURED_POSITIONS,
)


@pytest.mark.parametrize(
    "paths, device, extra, expected",
    [
        ({}, CUDA, {}, "captured"),
        ({"cuda_graphs": "off"}, CUDA, {}, "direct: CUDA graphs off"),
        ({}, CPU, {}, "direct: CUDA graphs off"),
        ({"lstm": "sorted"}, CUDA, {}, "direct: not the static LSTM"),
        ({"char_cnn": "distinct_words"}, CUDA, {}, "direct: the character CNN's distinct words"),
        ({}, CUDA, {"word_embeddings": True}, "direct: word embeddings (ELMoForManyLangs)"),
    ],
)
def test_the_training_step_is_captured_where_the_paths_allow_it(paths, device, extra, expected, machine):
    machine(False, True, device)
    resolved = resolve(ElmoPaths(**paths), device, F32, True, **extra)
    assert resolved.training_step == expected and f"training_step: {expected}" in str(resolved).splitlines()
    assert resolve(ElmoPaths(**paths), device, F32, False, **extra).training_step is None  # no training step
    assert resolved.for_training_step(**BATCH_THAT_CAPTURES).training_step == expected


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(labels=False), "no labels"),
        (dict(outputs_beyond_loss=True), "outputs beyond the loss and the final state"),
        (dict(carried=False), "a final state without a start state, or a start state without use_cache"),
        (dict(state_takes_gradients=True), "a start state that takes gradients"),
        (dict(gradient_checkpointing=True), "gradient checkpointing"),
        (
            dict(positions_per_direction=compute_paths.MAX_CAPTURED_POSITIONS + 1),
            f"more than {compute_paths.MAX_CAPTURED_POSITIONS} positions per direction keep the GPU busy",
        ),
    ],
)
def test_a_batch_that_cannot_be_captured_says_why(change, reason, machine):
    machine(False, True, CUDA)
    resolved = resolve(ElmoPaths(), CUDA, F32, True)
    step = resolved.for_training_step(**{**BATCH_THAT_CAPTURES, **change})
    assert step.training_step == f"direct: {reason}" and step == resolved  # the same paths run the step directly
