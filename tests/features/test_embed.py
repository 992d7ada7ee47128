"""`hf-elmo embed`: datasets against the model run in Python one sentence at a time, the original's carried-state
numbers (the TensorFlow fixture outputs), empty lines, interruption and bad input."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import torch
from conftest import FIXTURES, fixture_batches

from hf_elmo import ElmoModel, ElmoTokenizer
from hf_elmo.commands.cli import main as cli_main

LINES = [
    "The bank of the river .",
    "I went to the bank to deposit money",
    "",
    "Über naïve 日本語 😀 " + "x" * 60,
    "The bank of the river .",  # the same sentence at another position, in another batch
    "  Hi   there  ",
    "a",
]


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def embed(tmp_path, model_dir, lines, *options):
    source = write_lines(tmp_path / "in.txt", lines)
    output = tmp_path / "out.hdf5"
    code = cli_main(["embed", str(source), str(output), "--model", str(model_dir), "--quiet", *options])
    assert code == 0
    return output


def line_vectors(h5file, index):
    """Line `index`'s dataset in either layout."""
    if h5file.attrs.get("layout") == "packed":
        start, count = h5file["spans"][index]
        return h5file["vectors"][..., start : start + count, :]
    return h5file[str(index)][...]


def alone(model, words):
    """Layers `(L + 1, n_words, 2P)` of one sentence run on its own, boundaries removed."""
    batch = ElmoTokenizer()([words], is_split_into_words=True, return_tensors="pt")
    with torch.no_grad():
        layers = torch.stack(model(**batch, output_hidden_states=True).hidden_states)
    return layers[:, 0, 1 : len(words) + 1].numpy()


@pytest.fixture(scope="module")
def model64(converted_dirs):
    return ElmoModel.from_pretrained(converted_dirs["allennlp"]).double().eval()


def softmax(w):
    e = np.exp(np.asarray(w, dtype=np.float64) - max(w))
    return e / e.sum()


EXPECTED = {
    "--all": lambda layers: layers,
    "--top": lambda layers: layers[-1],
    "--average": lambda layers: layers.sum(axis=0) / 3,
    "--scalar-mix-weights": lambda layers: np.einsum("l,lnd->nd", softmax([0.5, -1.0, 2.0]), layers),
}


@pytest.mark.parametrize("layout", ["per-line", "packed"])
@pytest.mark.parametrize("layers", EXPECTED)
def test_datasets_equal_the_model_run_sentence_by_sentence(layers, layout, converted_dirs, model64, tmp_path):
    extra = ["0.5", "-1.0", "2.0"] if layers == "--scalar-mix-weights" else []
    output = embed(
        tmp_path,
        converted_dirs["allennlp"],
        LINES,
        layers,
        *extra,
        "--batch-size",
        "2",
        "--dtype",
        "float64",
        "--layout",
        layout,
    )
    with h5py.File(output, "r") as f:
        if layout == "packed":
            assert set(f) == {"vectors", "spans", "sentence_to_index"} and f["vectors"].dtype == np.float64
            assert (f["spans"][4] == f["spans"][0]).all(), "a repeated line has its first copy's span"
            distinct_words = sum(len(line.split()) for line in dict.fromkeys(line.strip() for line in LINES))
            assert f["vectors"].shape[-2] == distinct_words, "each distinct line's words stored once"
        else:
            assert set(f) == {str(i) for i in range(len(LINES))} | {"sentence_to_index"}
            assert f["4"] == f["0"], "a repeated line is a hard link to its first dataset"
        for i, line in enumerate(LINES):
            expected = EXPECTED[layers](alone(model64, line.split()))
            actual = line_vectors(f, i)
            assert actual.dtype == np.float64 and actual.shape == expected.shape
            np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-12)
        index = json.loads(f["sentence_to_index"][0])
    distinct = dict.fromkeys(line.strip() for line in LINES)
    assert index == {line: str(next(i for i, x in enumerate(LINES) if x.strip() == line)) for line in distinct}


def test_float32_output_and_empty_lines(converted_dirs, tmp_path):
    output = embed(tmp_path, converted_dirs["allennlp"], ["", "a b", ""], "--all")
    with h5py.File(output, "r") as f:
        assert f["0"].shape == f["2"].shape == (3, 0, 32) and f["1"].shape == (3, 2, 32)
        assert f["1"].dtype == np.float32
    output.unlink()
    output = embed(tmp_path, converted_dirs["allennlp"], [""], "--average")
    with h5py.File(output, "r") as f:
        assert f["0"].shape == (0, 32)
    output.unlink()
    (tmp_path / "empty.txt").write_bytes(b"")
    assert (
        cli_main(
            [
                "embed",
                str(tmp_path / "empty.txt"),
                str(output),
                "--model",
                str(converted_dirs["allennlp"]),
                "--top",
                "--quiet",
            ]
        )
        == 0
    )
    with h5py.File(output, "r") as f:
        assert list(f) == ["sentence_to_index"] and json.loads(f["sentence_to_index"][0]) == {}


def test_packed_layout_across_windows_and_empty_lines(converted_dirs, model64, tmp_path):
    """Batches of 1 make windows of 16 lines: a line repeated in a later window gets the first copy's span, an empty
    line an empty span, and the spans follow the file's lines while the rows follow the order computed."""
    lines = [" ".join(f"w{n}x{i}" for i in range(1 + n % 5)) for n in range(20)]
    lines += [lines[2], "", lines[0]]
    output = embed(
        tmp_path,
        converted_dirs["allennlp"],
        lines,
        "--all",
        "--batch-size",
        "1",
        "--layout",
        "packed",
        "--dtype",
        "float64",
    )
    with h5py.File(output, "r") as f:
        spans = f["spans"][...]
        assert spans.shape == (23, 2) and f["vectors"].shape == (3, 60, 32)  # 20 lines of 1-5 words: 60 rows
        assert (spans[20] == spans[2]).all() and (spans[22] == spans[0]).all() and spans[21][1] == 0
        assert line_vectors(f, 21).shape == (3, 0, 32)
        for i in (0, 4, 17, 20):
            np.testing.assert_allclose(line_vectors(f, i), alone(model64, lines[i].split()), rtol=0, atol=1e-12)
        rows = sorted(row for start, count in spans[:20] for row in range(start, start + count))
        assert rows == list(range(60)), "every row belongs to exactly one line"
    output.unlink()
    (tmp_path / "empty.txt").write_bytes(b"")
    code = cli_main(
        ["embed", str(tmp_path / "empty.txt"), str(output), "--model", str(converted_dirs["allennlp"]), "--top"]
        + ["--quiet", "--layout", "packed"]
    )
    with h5py.File(output, "r") as f:
        assert code == 0 and f["vectors"].shape == (0, 32) and f["spans"].shape == (0, 2)
        assert f["vectors"].dtype == np.float32


@pytest.mark.parametrize("layout", ["per-line", "packed"])
def test_float16_output_is_the_float32_output_rounded(layout, converted_dirs, tmp_path):
    lines = LINES[:4]
    stored = {}
    for dtype in ("float32", "float16"):
        output = embed(
            tmp_path, converted_dirs["allennlp"], lines, "--all", "--layout", layout, "--output-dtype", dtype
        )
        with h5py.File(output, "r") as f:
            stored[dtype] = [line_vectors(f, i) for i in range(len(lines))]
        output.unlink()
    for wide, narrow in zip(stored["float32"], stored["float16"]):
        assert wide.dtype == np.float32 and narrow.dtype == np.float16
        np.testing.assert_array_equal(narrow, wide.astype(np.float16))


def test_same_line_same_vectors_without_sharing(converted_dirs, model64, tmp_path):
    """With --forget-sentences nothing is shared between the two copies: each is computed in its own batch."""
    lines = ["x y z", "a b", "c d e f g h", "x y z"]
    output = embed(
        tmp_path,
        converted_dirs["allennlp"],
        lines,
        "--top",
        "--batch-size",
        "1",
        "--forget-sentences",
        "--dtype",
        "float64",
    )
    with h5py.File(output, "r") as f:
        assert "sentence_to_index" not in f
        first, last = f["0"][...], f["3"][...]
    expected = alone(model64, ["x", "y", "z"])[-1]
    np.testing.assert_allclose(first, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(last, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["per-line", "packed"])
@pytest.mark.parametrize("name", ["allennlp", "bilm-tf"])
def test_carry_state_reproduces_the_original_outputs(name, layout, converted_dirs, tmp_path):
    """The fixture numbers came from running batch i = [s0[i], s1[i], s2[i]] in order through one stateful model:
    the same lines in that order with --carry-state --batch-size 3 must give them."""
    batches = fixture_batches(name)
    lines = [" ".join(words) for sentences, _ in batches for words in sentences]
    output = embed(
        tmp_path, converted_dirs[name], lines, "--top", "--carry-state", "--batch-size", "3", "--layout", layout
    )
    with h5py.File(output, "r") as f:
        for i, (_sentences, expected) in enumerate(batches):
            for k in range(3):
                actual = line_vectors(f, 3 * i + k)
                assert np.allclose(actual, expected[k], atol=1e-6, rtol=1e-5), (i, k)
    # Without the carried state only the first batch matches.
    output.unlink()
    output = embed(tmp_path, converted_dirs[name], lines, "--top", "--batch-size", "3")
    with h5py.File(output, "r") as f:
        assert not np.allclose(f["3"][...], batches[1][1][0], atol=1e-3)


def test_carry_state_rows_continue_like_the_original(converted_dirs, tmp_path):
    """Batches of 2, then 1: the row of the short last batch continues row 0; a later larger batch would start its
    new rows from zeros (checked through the Python model with explicit states)."""
    model = ElmoModel.from_pretrained(converted_dirs["allennlp"]).double().eval()
    lines = ["a b c", "d e", "f g h i"]
    output = embed(
        tmp_path, converted_dirs["allennlp"], lines, "--top", "--carry-state", "--batch-size", "2", "--dtype", "float64"
    )
    tokenizer = ElmoTokenizer()
    with torch.no_grad():
        first = model(
            **tokenizer(
                [line.split() for line in lines[:2]], is_split_into_words=True, padding=True, return_tensors="pt"
            ),
            use_cache=True,
        )
        row0 = tuple(t[:, :1] for t in first.state)
        second = model(**tokenizer([lines[2].split()], is_split_into_words=True, return_tensors="pt"), state=row0)
    with h5py.File(output, "r") as f:
        np.testing.assert_allclose(f["0"][...], first.last_hidden_state[0, 1:4].numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(f["1"][...], first.last_hidden_state[1, 1:3].numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(f["2"][...], second.last_hidden_state[0, 1:5].numpy(), rtol=0, atol=1e-12)


def test_raw_text_uses_the_tokenizer_word_splitter(converted_dirs, model64, tmp_path):
    line = "I don't know, it's fine."
    output = embed(tmp_path, converted_dirs["allennlp"], [line], "--top", "--raw", "--dtype", "float64")
    words = ["I", "do", "n't", "know", ",", "it", "'s", "fine", "."]
    assert ElmoTokenizer().split_words(line) == words
    with h5py.File(output, "r") as f:
        np.testing.assert_allclose(f["0"][...], alone(model64, words)[-1], rtol=0, atol=1e-12)


def test_original_files_as_model(tmp_path, converted_dirs):
    options, weights = FIXTURES / "allennlp/options.json", FIXTURES / "allennlp/lm_weights.hdf5"
    source = write_lines(tmp_path / "in.txt", LINES)
    a, b = tmp_path / "a.hdf5", tmp_path / "b.hdf5"
    assert (
        cli_main(
            ["embed", str(source), str(a), "--options", str(options), "--weights", str(weights), "--top", "--quiet"]
        )
        == 0
    )
    assert cli_main(["embed", str(source), str(b), "--model", str(converted_dirs["allennlp"]), "--top", "--quiet"]) == 0
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert all(np.array_equal(fa[str(i)][...], fb[str(i)][...]) for i in range(len(LINES)))


# --- interruption and bad input -------------------------------------------------------------------


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_killed_midway_leaves_no_output_file(how, converted_dirs, tmp_path):
    """The input is a pipe kept open after some lines, so the process is certainly midway when it is killed."""
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    output = tmp_path / "out.hdf5"
    command = [
        sys.executable,
        "-m",
        "hf_elmo.commands",
        "embed",
        str(fifo),
        str(output),
        "--top",
        "--batch-size",
        "1",
        "--quiet",
        "--model",
        str(converted_dirs["allennlp"]),
    ]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    hang_guard = time.monotonic() + 600  # only against a hang: a busy machine may take long to start it
    try:
        while True:  # opening a pipe for writing blocks until the reader opens it: wait without blocking
            try:
                descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                assert process.poll() is None, process.stderr.read()
                assert time.monotonic() < hang_guard, "the command did not open its input"
                time.sleep(0.05)
        os.set_blocking(descriptor, True)
        with os.fdopen(descriptor, "w") as pipe:
            pipe.write("a b c\n" * 40)  # more than one window: some datasets are written
            pipe.flush()
            while not [p for p in tmp_path.iterdir() if p.name.startswith(".out.hdf5.tmp-")]:
                assert process.poll() is None, process.stderr.read()
                assert time.monotonic() < hang_guard, "no temporary output appeared"
                time.sleep(0.05)
            time.sleep(0.5)
            process.send_signal(how)
            process.wait(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    assert not output.exists()
    if how == signal.SIGTERM:
        assert process.returncode == 130 and "not written" in process.stderr.read()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["in.fifo"]


def earlier_output(path):
    with h5py.File(path, "w") as f:
        f["0"] = np.zeros((1, 32), dtype=np.float32)
    return path.read_bytes()


def test_interrupt_keeps_an_existing_output(converted_dirs, tmp_path, monkeypatch):
    output = tmp_path / "out.hdf5"
    previous = earlier_output(output)
    from hf_elmo.features import embed as embed_elmo

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(embed_elmo.Embedder, "__call__", interrupted)
    source = write_lines(tmp_path / "in.txt", LINES)
    args = [
        "embed",
        str(source),
        str(output),
        "--model",
        str(converted_dirs["allennlp"]),
        "--top",
        "--quiet",
        "--force",
    ]
    assert cli_main(args) == 130
    assert output.read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.hdf5"]


@pytest.mark.parametrize("store", ["PerLineStore", "PackedStore"])
def test_a_failed_write_is_one_line_and_leaves_nothing(store, converted_dirs, tmp_path, monkeypatch, capsys):
    """The file is written on a thread of its own: its error still reaches the user, and no file is left."""
    import errno

    from hf_elmo.features import embed as embed_elmo

    calls = []

    def full_disk(self, *args):
        calls.append(args)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(getattr(embed_elmo, store), "add", full_disk)
    source = write_lines(tmp_path / "in.txt", [f"line {n}" for n in range(6)])
    output = tmp_path / "out.hdf5"
    layout = ["--layout", "packed"] if store == "PackedStore" else []
    args = ["embed", str(source), str(output), "--model", str(converted_dirs["allennlp"]), "--top", "--quiet"]
    assert cli_main([*args, "--batch-size", "1", *layout]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {output}: not written ({os.strerror(errno.ENOSPC)})"], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_the_next_batch_is_computed_while_one_is_written(converted_dirs, tmp_path, monkeypatch):
    """Writing batch k waits until batch k + 1 is being computed: the run finishes only if the two overlap."""
    import threading

    from hf_elmo.features import embed as embed_elmo

    second_batch_started = threading.Event()
    compute, add = embed_elmo.Embedder.__call__, embed_elmo.PackedStore.add
    batches = []

    def counting_compute(self, sentences, carry_state=False):
        batches.append(threading.current_thread())
        if len(batches) == 2:
            second_batch_started.set()
        return compute(self, sentences, carry_state)

    def waiting_add(self, indices, counts, vectors):
        if indices == [0]:
            assert second_batch_started.wait(timeout=300), "batch 2 was not computed while batch 1 was written"
            assert threading.current_thread() is not batches[0]
        add(self, indices, counts, vectors)

    monkeypatch.setattr(embed_elmo.Embedder, "__call__", counting_compute)
    monkeypatch.setattr(embed_elmo.PackedStore, "add", waiting_add)
    output = embed(
        tmp_path,
        converted_dirs["allennlp"],
        ["a b c", "d e", "f"],
        "--top",
        "--batch-size",
        "1",
        "--layout",
        "packed",
    )
    with h5py.File(output, "r") as f:
        assert len(batches) == 3 and f["spans"][:, 1].tolist() == [3, 2, 1]


def _truncated_safetensors(folder):
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:3000])


def _bad_config(folder):
    (folder / "config.json").write_text('{"model_type": "elmo", "cell_dim": ')


def _copy_model(converted_dirs, tmp_path, damage):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(converted_dirs["allennlp"], folder)
    damage(folder)
    return ["--model", str(folder)]


def _truncated_hdf5(converted_dirs, tmp_path):
    weights = tmp_path / "weights.hdf5"
    weights.write_bytes((FIXTURES / "allennlp/lm_weights.hdf5").read_bytes()[:6000])
    return ["--options", str(FIXTURES / "allennlp/options.json"), "--weights", str(weights)]


BAD_RUNS = {
    "invalid UTF-8": (
        lambda d, p: ["--model", str(d["allennlp"])],
        b"ok line\nbad \xff byte\n",
        [],
        r"in\.txt: line 2 is not valid UTF-8 \(byte 5",
    ),
    "truncated safetensors": (
        lambda d, p: _copy_model(d, p, _truncated_safetensors),
        b"a\n",
        [],
        r"model: cannot load the model",
    ),
    "corrupted config.json": (lambda d, p: _copy_model(d, p, _bad_config), b"a\n", [], r"model: cannot load the model"),
    "missing model": (lambda d, p: ["--model", str(p / "absent")], b"a\n", [], r"absent: no config\.json"),
    "truncated weights.hdf5": (_truncated_hdf5, b"a\n", [], r"weights\.hdf5: not an HDF5 file or corrupted"),
    "mix weights per layer": (
        lambda d, p: ["--model", str(d["allennlp"])],
        b"a\n",
        ["--scalar-mix-weights", "1", "2"],
        r"needs 3 values \(one per layer of this model\), got 2",
    ),
    "batch size": (
        lambda d, p: ["--model", str(d["allennlp"])],
        b"a\n",
        ["--batch-size", "0"],
        r"--batch-size must be >= 1",
    ),
    "no such input": (lambda d, p: ["--model", str(d["allennlp"])], None, [], r"in\.txt: no such input file"),
    "unknown device": (
        lambda d, p: ["--model", str(d["allennlp"])],
        b"a\n",
        ["--device", "gpu7"],
        r"unknown device 'gpu7'",
    ),
}


@pytest.mark.parametrize("case", BAD_RUNS)
def test_bad_runs_give_one_line_and_leave_nothing(case, converted_dirs, tmp_path, capsys):
    model_args, content, extra, message = BAD_RUNS[case]
    model_args = model_args(converted_dirs, tmp_path)
    if content is not None:
        (tmp_path / "in.txt").write_bytes(content)
    before = sorted(tmp_path.iterdir())
    output = tmp_path / "out.hdf5"
    layers = [] if extra[:1] == ["--scalar-mix-weights"] else ["--top"]
    code = cli_main(["embed", str(tmp_path / "in.txt"), str(output), *model_args, *layers, *extra, "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and err.startswith("error: ") and re.search(message, err), err
    assert sorted(tmp_path.iterdir()) == before and not output.exists()


def test_progress_bar_shows_sentences_per_second(converted_dirs, tmp_path, capsys):
    source = write_lines(tmp_path / "in.txt", LINES)
    assert (
        cli_main(
            ["embed", str(source), str(tmp_path / "out.hdf5"), "--model", str(converted_dirs["allennlp"]), "--top"]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert f"{len(LINES)}/{len(LINES)}" in err and "sentences/s" in err


def test_existing_output_needs_force(converted_dirs, tmp_path, capsys):
    output = tmp_path / "out.hdf5"
    output.write_bytes(b"keep me")
    source = write_lines(tmp_path / "in.txt", ["a"])
    args = ["embed", str(source), str(output), "--model", str(converted_dirs["allennlp"]), "--top", "--quiet"]
    assert cli_main(args) == 2
    assert "file exists (use --force" in capsys.readouterr().err and output.read_bytes() == b"keep me"
    assert cli_main([*args, "--force"]) == 2  # --force replaces only an earlier output: an HDF5 file
    assert "out.hdf5: is not an HDF5 file" in capsys.readouterr().err and output.read_bytes() == b"keep me"
    earlier_output(output)
    assert cli_main(args) == 2
    assert cli_main([*args, "--force"]) == 0
    with h5py.File(output, "r") as f:
        assert f["0"].shape == (1, 32)


def test_two_processes_embed_their_parts_into_one_file_in_line_order(converted_dirs, model64, tmp_path):
    """`torchrun --nproc_per_node 2 -m hf_elmo.commands embed ...`: each process embeds every other line into a part of
    its own, and the output reads as one file in the input's order, each line's vectors those of the line alone."""
    lines = [*LINES, "a", "The bank of the river .", "", "b c d"]  # repeats within a part and across parts
    source = write_lines(tmp_path / "in.txt", lines)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "hf_elmo.commands",
        "embed",
        str(source),
        str(tmp_path / "out.hdf5"),
        "--model",
        str(converted_dirs["allennlp"]),
        "--all",
        "--dtype",
        "float64",
        "--batch-size",
        "2",
        "--quiet",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stderr.count(f"{len(lines)} sentences embedded to") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.hdf5"]  # no part left
    with h5py.File(tmp_path / "out.hdf5", "r") as f:
        assert sorted(f) == sorted([*map(str, range(len(lines))), "sentence_to_index"])
        for index, line in enumerate(lines):
            np.testing.assert_allclose(f[str(index)][...], alone(model64, line.split()), atol=1e-9, rtol=0)
        first = {}
        for index, line in enumerate(lines):
            first.setdefault(line.strip(), str(index))
        assert json.loads(f["sentence_to_index"][0]) == first
        address = {index: h5py.h5o.get_info(f[str(index)].id).addr for index in range(len(lines))}
        assert address[0] == address[4] == address[8]  # a line repeated within part 0: stored once
        assert address[6] != address[7]  # "a" in each part: computed by both
