"""`benchmarks/gpu_report.py` is what a GPU machine runs to measure the GPU targets; where none is at hand its code
paths run here, on CPU tensors with tiny sizes (Triton interpreted), so that the report is ready when one is. Its
numbers here mean nothing except the exactness rows, which must hold on any device."""

import re
from pathlib import Path

import pytest
import torch

from hf_elmo import ElmoConfig

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def report(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_report

    monkeypatch.setattr(gpu_report, "DEVICE", "cpu")
    monkeypatch.setattr(gpu_report, "TABLES", [])
    monkeypatch.setattr(gpu_report, "BATCHES", [4])
    monkeypatch.setattr(gpu_report, "CHAR_CNN_BATCHES", (8,))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *args, **kwargs: None)
    preset = ElmoConfig.from_preset.__func__

    def tiny(cls, name, **kwargs):
        config = preset(cls, "small", **kwargs)
        config.filters, config.n_highway, config.projection_dim, config.cell_dim = [[1, 8], [2, 8], [3, 16]], 1, 16, 32
        if "vocab_size" in kwargs:
            config.vocab_size, config.num_softmax_samples = 500, 64
        return config

    monkeypatch.setattr(ElmoConfig, "from_preset", classmethod(tiny))
    make_batch, random_sentences = gpu_report.make_batch, gpu_report.random_sentences
    monkeypatch.setattr(
        gpu_report, "make_batch", lambda rows, words, vocab, device, seed=0: make_batch(rows, words, 500, device, seed)
    )
    monkeypatch.setattr(
        gpu_report, "random_sentences", lambda rows, words, seed=0: random_sentences(min(rows, 8), words, seed)
    )
    return gpu_report


def rows_of(text: str, first_column: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip().startswith(first_column)]


def test_report_sections_run_and_the_gpu_path_is_exact(report):
    deadline = float("inf")  # every section runs, however busy the machine
    report.exactness(quick=True)
    report.training(quick=True, deadline=deadline)
    report.inference(quick=True, deadline=deadline)
    report.char_cnn(quick=True, deadline=deadline)
    exactness, training, inference, character_encoder = report.TABLES
    # The GPU path (static shapes, Triton kernels interpreted), the CPU path and the reference, in float32, against
    # a float64 run of the reference: values 1e-5, gradients 1e-4 relative (the bounds).
    exact_rows = rows_of(exactness, "small, random weights")
    assert {row[0].split(", ")[2] for row in exact_rows} >= {"static", "sorted", "reference"}
    for what, values, gradients in exact_rows:
        assert float(values) <= 1e-5 and float(gradients) <= 1e-4, what
    for what, cosines in rows_of(exactness, "small, bfloat16 autocast"):
        assert min(float(c) for c in cosines.split(" / ")) >= 0.99, what
    # (The original implementations' fixtures on the GPU path are tests/model/test_lstm_static.py's.)
    # Every path trained and embedded at a rate (none failed or was skipped).
    for table, first in ((training, ("small", "original")), (inference, ("float32", "bfloat16"))):
        rows = [row for name in first for row in rows_of(table, name)]
        assert rows and all(re.fullmatch(r"[\d,]+", row[4 if table is training else 3]) for row in rows), table
    # The character encoder alone, with its kernels and without, on both texts.
    timed = [re.split(r"\s{2,}", line.strip()) for line in character_encoder.splitlines()[2:] if line.strip()]
    assert len(timed) == 4 and {row[2] for row in timed} == {"fused", "not fused"}, character_encoder
    assert all(re.fullmatch(r"[\d.]+", value) for row in timed for value in row[3:]), character_encoder


def test_output_file_gets_each_table_as_it_is_measured(report, tmp_path):
    output = tmp_path / "report.txt"
    output.write_text("machine: here\n\n")
    report.OUTPUT = output
    try:
        report.table("1. a table", ["what", "value"], [["x", 1]])
        assert "1. a table" in output.read_text()
        report.record("training: failed: RuntimeError: out of memory\n")
    finally:
        report.OUTPUT = None
    text = output.read_text()
    assert text.startswith("machine: here") and text.index("1. a table") < text.index("training: failed")


@pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")  # the profiler asked for CUDA activity
def test_inference_profile_runs(report):
    """The inference batch's profile (a CUDA-only section otherwise) runs and gives a rate."""
    row = report.inference_profile(8)
    assert row[0].startswith("inference") and re.fullmatch(r"[\d,]+", row[1]) and re.fullmatch(r"[\d,]+", row[2])
    assert report.TABLES[-1].startswith("4b. Where the GPU time of an inference batch goes")


def test_kernels_are_told_apart_by_name(report):
    """The Triton kernels of the character encoder are not counted as reductions (`_window_max_kernel` holds
    `max_kernel`), nor the fused step as anything but the LSTM's."""
    assert report.kernel_kind("_window_max_kernel") == "character CNN (Triton)"
    assert report.kernel_kind("_highway_backward_kernel") == "character CNN (Triton)"
    assert report.kernel_kind("_gates_cell_forward_kernel") == "LSTM steps, elementwise (Triton)"
    assert report.kernel_kind("void at::native::reduce_kernel<512, 1>") == "reductions (norms, sums, max)"
    assert report.kernel_kind("sm90_xmma_gemm_bf16bf16_bf16f32") == "matrix products"
