"""Protein sequences (SeqVec, Heinzinger et al. 2019): SeqVec's usage code on `hf_elmo.compat.allennlp` gives AllenNLP
0.9's numbers on SeqVec-shaped models (`tests/fixtures/seqvec/`, made by AllenNLP's own code); FASTA read as SeqVec
reads it, bad files refused naming the record; `hf-elmo embed --fasta` (per-residue and per-protein files, the
residue budget changing no vector)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import FIXTURES
from reference_elmo import bilm as reference_bilm
from seqvec_shaped import (
    SEQVEC_OPTIONS,
    SMALL_OPTIONS,
    memory_bound_per_residue,
    random_protein,
    write_seqvec_shaped,
)

from hf_elmo import ElmoConfig, ElmoModel, ElmoTokenizer
from hf_elmo.commands.cli import main as cli_main
from hf_elmo.compat.allennlp import ElmoEmbedder
from hf_elmo.convert.original_format import load_original_elmo
from hf_elmo.features.embed import Embedder, LayerSelector, NonFiniteVectors
from hf_elmo.features.embed_proteins import OutOfMemoryFallback, embed_fasta, partial_path, residue_batches
from hf_elmo.features.hub import render_model_card
from hf_elmo.io.fasta import FastaRecord, read_fasta
from hf_elmo.io.files import ElmoInputError
from hf_elmo.pretrained_elmo import add_origin

SEQVEC_FIXTURE = FIXTURES / "seqvec" / "allennlp_outputs.npz"
MODEL_OPTIONS = {"seqvec": SEQVEC_OPTIONS, "small": SMALL_OPTIONS}


@pytest.fixture(scope="session")
def seqvec_shaped_models(tmp_path_factory):
    """name -> (options.json, weights.hdf5) of the fixture's models, written once per session."""
    folder = tmp_path_factory.mktemp("seqvec-shaped")
    return {name: write_seqvec_shaped(folder / name, options) for name, options in MODEL_OPTIONS.items()}


def stored_rows(length: int) -> list[int]:
    # The residues the fixture keeps (conversion/seqvec_reference_outputs.py).
    step = max(1, length // 8)
    return sorted({0, 1, length - 2, length - 1, *range(0, length, step)} & set(range(length)))


def assert_matches_allennlp(embedding: np.ndarray, expected: dict, where: str):
    """`embedding` `(3, L, 2P)` against AllenNLP's stored rows and reductions. A value of a network of thousands of
    float32 products per value is compared within 1e-5 of its layer's largest magnitude (docs/testing.md); the
    per-protein vector sums the three layers, so its bound is the sum of theirs."""
    rows = embedding[:, stored_rows(embedding.shape[1])]
    assert rows.shape == expected["rows"].shape, where
    layer_bounds = 1e-5 * np.abs(expected["rows"]).max(axis=(1, 2))
    assert (np.abs(rows - expected["rows"]).max(axis=(1, 2)) <= layer_bounds).all(), where
    assert (np.abs(embedding.mean(axis=1) - expected["layer_means"]).max(axis=1) <= layer_bounds).all(), where
    per_protein = embedding.sum(axis=0).mean(axis=0)  # SeqVec's per-protein vector
    assert np.abs(per_protein - expected["per_protein"]).max() <= layer_bounds.sum(), where


@pytest.mark.parametrize("model", ["seqvec", "small"])
def test_seqvec_usage_gives_allennlps_numbers(seqvec_shaped_models, model):
    """SeqVec's calls, in the fixture's order on one embedder (state carried from call to call, as AllenNLP 0.9
    does): `embed_sentence(list(seq))`, `embed_batch([list(s) ...])`, `embed_sentences`, from 1 to 5,000 residues
    (the long ones on the small model of the same structure)."""
    stored = np.load(SEQVEC_FIXTURE)
    options_file, weight_file = seqvec_shaped_models[model]
    embedder = ElmoEmbedder(str(options_file), str(weight_file), cuda_device=-1)
    calls = json.loads(str(stored[f"{model}/calls"]))
    assert max(len(s) for _, sequences in calls for s in sequences) == (90 if model == "seqvec" else 5000)
    for c, (kind, sequences) in enumerate(calls):
        if kind == "embed_sentence":
            embeddings = [embedder.embed_sentence(list(sequences[0]))]
        elif kind == "embed_batch":
            embeddings = embedder.embed_batch([list(seq) for seq in sequences])
        else:
            embeddings = list(embedder.embed_sentences((list(seq) for seq in sequences), batch_size=2))
        for k, (sequence, embedding) in enumerate(zip(sequences, embeddings, strict=True)):
            hidden = 2 * MODEL_OPTIONS[model]["lstm"]["projection_dim"]
            assert embedding.shape == (3, len(sequence), hidden) and embedding.dtype == np.float32
            key = f"{model}/call_{c}/sequence_{k}"
            expected = {name: stored[f"{key}/{name}"] for name in ("rows", "layer_means", "per_protein")}
            assert_matches_allennlp(embedding, expected, key)


# --- FASTA and `hf-elmo embed --fasta` ------------------------------------------------------------------------------


def small_model_args(seqvec_shaped_models):
    options_file, weight_file = seqvec_shaped_models["small"]
    return ["--options", str(options_file), "--weights", str(weight_file)]


def embed_fasta_file(fasta, output, model_args, *options):
    code = cli_main(["embed", str(fasta), str(output), *model_args, "--fasta", "--quiet", *options])
    assert code == 0
    return output


def test_fasta_records_are_read_as_seqvec_reads_them(tmp_path):
    fasta = tmp_path / "in.fasta"
    fasta.write_bytes(
        b"\n>sp|P69905|HBA_HUMAN Hemoglobin subunit alpha\r\nMVLSPADKTN\r\n vkaawgkv \r\n\r\nGAHAG*\r\n"
        b">x1\nMXUOBZ\n>  spaced  header \nm k\n"
    )
    records = read_fasta(fasta)
    assert [(r.id, r.header, r.sequence, r.line) for r in records] == [
        ("sp|P69905|HBA_HUMAN", "sp|P69905|HBA_HUMAN Hemoglobin subunit alpha", "MVLSPADKTNVKAAWGKVGAHAG", 2),
        ("x1", "x1", "MXUOBZ", 7),
        ("spaced", "spaced  header", "MK", 9),
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        (">a\nMK\n>b one\nLL\n>a again\nMM\n", r"record 'a' \(line 5\) repeats the id of line 1"),
        (">a\nMK\n>empty\n\n>c\nMM\n", r"record 'empty' \(line 3\) has no residues"),
        (">a\nMK\n>stop\n*\n", r"record 'stop' \(line 3\) has no residues"),
        ("MKVL\n>a\nMK\n", r"line 1: not a FASTA file \(expected a header line starting with '>', got 'MKVL'\)"),
        ("sentence one\nsentence two\n", r"line 1: not a FASTA file"),
        ("", r"no FASTA record"),
        (">a\nMK*VL\n", r"record 'a' \(line 1\) has '\*' before the end of the sequence"),
        (">a\nMK-VL\n", r"record 'a' \(line 1\) has '-' in its sequence"),
        (">\nMK\n", r"line 1: a header without an id"),
        (">a/1-10\nMK\n", r"record 'a/1-10' \(line 1\): an id cannot hold '/'"),
    ],
)
def test_bad_fasta_is_refused_in_one_line_naming_the_record(text, message, seqvec_shaped_models, tmp_path, capsys):
    fasta = tmp_path / "in.fasta"
    fasta.write_text(text)
    output = tmp_path / "out.h5"
    model_args = small_model_args(seqvec_shaped_models)
    code = cli_main(["embed", str(fasta), str(output), *model_args, "--fasta", "--sum", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"error: {fasta}: ") and "\n" not in err, err
    assert re.search(message, err), err
    assert list(tmp_path.iterdir()) == [fasta]


PROTEINS = {  # id: sequence; lengths 1 to 700, two of the same length
    "one": "M",
    "short": "MKV",
    "p53_fragment": "MEEPQSDPSVEPPLSQETFSDLWKLLPENNVLSPLPSQAMDDLMLSPDDIEQWFTEDPGP",
    "same_length_a": "ACDEFGHIKLMNPQRSTVWY",
    "same_length_b": "YWVTSRQPNMLKIHGFEDCA",
    "rare": "MXUOBZKLAX",
}


def write_proteins(path, proteins=PROTEINS, extra=None):
    generator = np.random.default_rng(7)
    proteins = {**proteins, **(extra or {})}
    lines = []
    for record_id, sequence in proteins.items():
        lines.append(f">{record_id} protein {record_id} OS=test")
        lines += [sequence[i : i + 60] for i in range(0, len(sequence), 60)]
    path.write_text("\n".join(lines) + "\n")
    return {**proteins}, generator


def stateless_truth(seqvec_shaped_models, sequence):
    """`(3, L, 2P)` of one protein from the start state: AllenNLP's `embed_sentence` on a fresh embedder, which the
    fixture test above checks against AllenNLP's numbers."""
    options_file, weight_file = seqvec_shaped_models["small"]
    return ElmoEmbedder(str(options_file), str(weight_file), stateful=False).embed_sentence(list(sequence))


def layer_bound(truth: np.ndarray) -> float:
    # float32 runs of one model summed in other orders (another padding): 1e-5 of the largest magnitude per layer
    return 1e-5 * float(np.abs(truth).max())


def test_protein_command_writes_seqvecs_vectors_keyed_by_id(seqvec_shaped_models, tmp_path):
    proteins, _ = write_proteins(tmp_path / "in.fasta", extra={"long": "MKTAYIAKQR" * 70})
    residues, per_protein = tmp_path / "residues.h5", tmp_path / "proteins.h5"
    model_args = small_model_args(seqvec_shaped_models)
    embed_fasta_file(tmp_path / "in.fasta", residues, model_args, "--sum", "--per-protein", str(per_protein))
    every_layer = embed_fasta_file(tmp_path / "in.fasta", tmp_path / "all.h5", model_args, "--all")
    with h5py.File(residues) as summed, h5py.File(per_protein) as means, h5py.File(every_layer) as layers:
        assert set(summed) == set(means) == set(layers) == set(proteins)
        for record_id, sequence in proteins.items():
            truth = stateless_truth(seqvec_shaped_models, sequence)
            header = f"{record_id} protein {record_id} OS=test"
            assert summed[record_id].attrs["header"] == means[record_id].attrs["header"] == header
            assert summed[record_id].dtype == np.float32 and summed[record_id].shape == (len(sequence), 32)
            assert layers[record_id].shape == (3, len(sequence), 32)
            bound = layer_bound(truth)
            assert np.abs(layers[record_id][...] - truth).max() <= bound, record_id
            assert np.abs(summed[record_id][...] - truth.sum(axis=0)).max() <= 3 * bound, record_id
            assert np.abs(means[record_id][...] - truth.sum(axis=0).mean(axis=0)).max() <= 3 * bound, record_id


def test_residue_batches_are_longest_first_within_the_budget():
    generator = np.random.default_rng(3)
    lengths = [int(n) for n in generator.integers(1, 400, size=60)] + [900, 1]
    records = [FastaRecord(f"r{i}", f"r{i}", "A" * n, i) for i, n in enumerate(lengths)]
    for budget in (1, 50, 1000, 15_000):
        batches = residue_batches(records, budget)
        flat = [record for batch in batches for record in batch]
        assert sorted(r.id for r in flat) == sorted(r.id for r in records)
        assert [len(r.sequence) for r in flat] == sorted(lengths, reverse=True)
        for batch in batches:
            longest = len(batch[0].sequence)
            assert len(batch) == 1 or len(batch) * longest <= budget
        for before in batches[:-1]:  # a batch stops only when the next record would overflow it
            assert (len(before) + 1) * len(before[0].sequence) > budget


def test_the_residue_budget_changes_no_vector(seqvec_shaped_models, tmp_path):
    proteins, _ = write_proteins(tmp_path / "in.fasta")
    model_args = small_model_args(seqvec_shaped_models)
    outputs = [
        embed_fasta_file(
            tmp_path / "in.fasta", tmp_path / f"{budget}.h5", model_args, "--all", "--residue-budget", str(budget)
        )
        for budget in (1, 60, 100_000)
    ]
    files = [h5py.File(output) for output in outputs]
    for record_id in proteins:
        one_at_a_time = files[0][record_id][...]
        for other in files[1:]:
            assert np.abs(other[record_id][...] - one_at_a_time).max() <= layer_bound(one_at_a_time), record_id
    for f in files:
        f.close()


def test_a_long_protein_is_embedded_in_one_piece_whatever_the_budget(seqvec_shaped_models, tmp_path):
    """A protein longer than the residue budget goes alone and whole; with a budget that holds it and the short ones,
    it shares their batch. Both give the float64 recomputation of the whole protein from the start state (a protein
    cut at the budget, or reading another's padding or state, differs by orders more)."""
    long_protein = random_protein(4000, np.random.default_rng(44))
    proteins, _ = write_proteins(tmp_path / "in.fasta", extra={"long": long_protein})
    model_args = small_model_args(seqvec_shaped_models)
    model = load_original_elmo(*map(str, seqvec_shaped_models["small"]))
    char_ids = ElmoTokenizer()([list(long_protein)], is_split_into_words=True, return_tensors="pt")["input_ids"][0]
    truth = np.stack(reference_bilm(model.state_dict(), model.config, char_ids.numpy())[0])[:, 1:-1]
    # float32 over a recurrence of thousands of steps, each value a few hundred products: 1e-5 of a layer's largest
    bounds = 1e-5 * np.abs(truth).max(axis=(1, 2))
    for budget in (1000, 100_000):
        output = embed_fasta_file(
            tmp_path / "in.fasta", tmp_path / f"{budget}.h5", model_args, "--all", "--residue-budget", str(budget)
        )
        with h5py.File(output) as residues:
            vectors = residues["long"][...]
        assert vectors.shape == truth.shape, budget
        assert (np.abs(vectors - truth).max(axis=(1, 2)) <= bounds).all(), (budget, np.abs(vectors - truth).max())


def test_protein_options_are_checked_before_loading_the_model(seqvec_shaped_models, tmp_path, capsys):
    write_proteins(tmp_path / "in.fasta")
    model_args = small_model_args(seqvec_shaped_models)
    fasta, output = str(tmp_path / "in.fasta"), str(tmp_path / "out.h5")
    for options, message in [
        (["--sum", "--per-protein", str(tmp_path / "p.h5")], "--per-protein goes with --fasta"),
        (["--fasta", "--sum", "--carry-state"], "--carry-state does not go with --fasta"),
        (["--fasta", "--sum", "--residue-budget", "0"], "--residue-budget must be >= 1, got 0"),
        (["--fasta", "--sum", "--per-protein", output], "--per-protein must be another file than the output"),
    ]:
        code = cli_main(["embed", fasta, output, *model_args, "--quiet", *options])
        err = capsys.readouterr().err.strip()
        assert code == 2 and message in err and "\n" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.fasta"]


class GpuOfLimitedMemory(Embedder):
    """An embedder that runs out of memory, as a GPU would, for batches of more than `limit` padded residues."""

    limit = 100

    def __call__(self, sentences, carry_state=False):
        if len(sentences) * max(len(words) for words in sentences) > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return super().__call__(sentences, carry_state)


def limited_embedder(seqvec_shaped_models):
    options_file, weight_file = seqvec_shaped_models["small"]
    model = load_original_elmo(options_file, weight_file)
    return GpuOfLimitedMemory(model, ElmoTokenizer(), LayerSelector("sum", model.config.num_layers))


def test_out_of_memory_stops_naming_the_protein_and_writes_no_output(seqvec_shaped_models, tmp_path):
    proteins, _ = write_proteins(tmp_path / "in.fasta", extra={"titin_like": "MKTAYIAKQR" * 20})
    records = read_fasta(tmp_path / "in.fasta")
    embedder = limited_embedder(seqvec_shaped_models)
    with pytest.raises(ElmoInputError) as error:
        embed_fasta(
            embedder,
            records,
            tmp_path / "in.fasta",
            tmp_path / "residues.h5",
            tmp_path / "proteins.h5",
            embed_batch=OutOfMemoryFallback(embedder, cpu_fallback=False),
        )
    assert str(error.value) == (
        f"{tmp_path / 'in.fasta'}: record 'titin_like' (line 13): cpu ran out of memory for this protein of 200 "
        "residues alone; pass --cpu-fallback to embed such proteins on the CPU, or --device cpu"
    )
    # the proteins before it are kept for --resume, under hidden names
    assert sorted(p.name for p in tmp_path.iterdir()) == [".proteins.h5.partial", ".residues.h5.partial", "in.fasta"]


def test_cpu_fallback_embeds_what_does_not_fit_and_says_so(seqvec_shaped_models, tmp_path):
    proteins, _ = write_proteins(tmp_path / "in.fasta", extra={"titin_like": "MKTAYIAKQR" * 20})
    records = read_fasta(tmp_path / "in.fasta")
    embedder, reports = limited_embedder(seqvec_shaped_models), []
    fallback = OutOfMemoryFallback(embedder, cpu_fallback=True, report=reports.append)
    embed_fasta(embedder, records, "in.fasta", tmp_path / "residues.h5", residue_budget=200, embed_batch=fallback)
    assert reports == [
        "the GPU ran out of memory for a protein of 200 residues: embedding it on the CPU",
        "the GPU ran out of memory for a batch of 3 proteins: embedding them one at a time",
    ]
    with h5py.File(tmp_path / "residues.h5") as residues:
        for record_id, sequence in proteins.items():
            truth = stateless_truth(seqvec_shaped_models, sequence).sum(axis=0)
            assert np.abs(residues[record_id][...] - truth).max() <= layer_bound(truth), record_id


def test_the_repositorys_sample_of_real_proteins(seqvec_shaped_models, tmp_path):
    sample = Path(__file__).parents[2] / "data" / "proteins" / "sample.fasta"
    records = read_fasta(sample)
    assert [(r.id, len(r.sequence), r.sequence[:10]) for r in records] == [
        ("sp|P00864|CAPP_ECOLI", 883, "MNEQYSALRS"),
        ("6U7P:A|PDBID|CHAIN|SEQUENCE", 99, "PQITLWKRPL"),
    ]
    per_protein = tmp_path / "proteins.h5"
    model_args = small_model_args(seqvec_shaped_models)
    embed_fasta_file(sample, tmp_path / "residues.h5", model_args, "--sum", "--per-protein", str(per_protein))
    with h5py.File(per_protein) as means:
        assert means["6U7P:A|PDBID|CHAIN|SEQUENCE"].attrs["header"] == "6U7P:A|PDBID|CHAIN|SEQUENCE"
        truth = stateless_truth(seqvec_shaped_models, records[1].sequence).sum(axis=0)
        assert np.abs(means[records[1].id][...] - truth.mean(axis=0)).max() <= 3 * layer_bound(truth)


PEAK_RSS_SCRIPT = """
import resource, sys
from hf_elmo.commands.cli import main
code = main(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 if code == 0 else -1)
"""


def test_a_titin_sized_protein_stays_within_the_memory_bound_per_residue(seqvec_shaped_models, tmp_path):
    """Peak RSS of `hf-elmo embed --fasta` on 35,000 residues, less that of the same command on 10 residues (the
    model, the code), is within the documented bound per residue: nothing grows faster than the protein."""
    generator = np.random.default_rng(35)
    peaks = {}
    for length in (10, 35_000):
        fasta = tmp_path / f"{length}.fasta"
        fasta.write_text(f">titin_like\n{random_protein(length, generator)}\n")
        command = ["embed", str(fasta), str(tmp_path / f"{length}.h5"), "--fasta", "--sum", "--quiet"]
        run = subprocess.run(
            [sys.executable, "-c", PEAK_RSS_SCRIPT, *command, *small_model_args(seqvec_shaped_models)],
            capture_output=True,
            text=True,
            check=True,
        )
        peaks[length] = int(run.stdout.split()[-1])
        with h5py.File(tmp_path / f"{length}.h5") as residues:
            assert residues["titin_like"].shape == (length, 32)
    assert peaks[35_000] - peaks[10] <= (35_000 - 10) * memory_bound_per_residue(SMALL_OPTIONS), peaks


def test_a_converted_seqvecs_card_names_the_paper_and_licence(seqvec_shaped_models, tmp_path):
    """docs/proteins.md's recipe: the history line added after `hf-elmo convert` is in the card save_pretrained
    writes, and the card pushed with `license="mit"` carries it."""
    options_file, weight_file = seqvec_shaped_models["small"]
    folder = tmp_path / "seqvec-hf"
    convert = ["convert", "--options", str(options_file), "--weights", str(weight_file), "--output-dir", str(folder)]
    assert cli_main(convert) == 0
    model = ElmoModel.from_pretrained(folder)
    paper = "SeqVec (Heinzinger et al. 2019, BMC Bioinformatics 20, 723), MIT licence"
    add_origin(model.config, paper)
    model.save_pretrained(folder)
    card = (folder / "README.md").read_text()
    assert "Converted by `hf-elmo convert`" in card and f"* {paper}" in card
    pushed = render_model_card(ElmoModel.from_pretrained(folder), "someone/seqvec", license="mit")
    assert pushed.data.license == "mit" and paper in pushed.text


# --- training a protein biLM -------------------------------------------------------------------------------------

RESIDUE_VOCAB = Path(__file__).parents[2] / "data" / "proteins" / "residue_vocab.txt"


def protein_corpus(tmp_path, count=48) -> Path:
    """`hf-elmo fasta-text` of a FASTA file of `count` random proteins of 20 to 60 residues (multi-line records)."""
    generator = np.random.default_rng(4)
    sequences = [random_protein(int(generator.integers(20, 61)), generator) for _ in range(count)]
    fasta = tmp_path / "family.fasta"
    fasta.write_text("".join(f">p{i}\n{s[:30]}\n{s[30:].lower()}*\n" for i, s in enumerate(sequences)))
    text = tmp_path / "family.txt"
    assert cli_main(["fasta-text", str(fasta), "--output", str(text)]) == 0
    lines = text.read_text().splitlines()
    assert lines == [" ".join(s) for s in sequences]  # one protein per line, residues as words
    return text


def train_arguments(text, output_dir, tmp_path, *more):
    return [
        "train",
        "--train-files",
        str(text),
        "--split",
        "whitespace",
        "--vocab",
        str(RESIDUE_VOCAB),
        "--output-dir",
        str(output_dir),
        "--window",
        "24",
        "--per-device-train-batch-size",
        "8",
        "--max-steps",
        "3",
        "--save-steps",
        "3",
        "--data-cache-dir",
        str(tmp_path / "cache"),
        "--disable-tqdm",
        *more,
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_a_protein_bilm_trains_from_scratch_with_the_residue_vocabulary(stream, tmp_path):
    text = protein_corpus(tmp_path)
    output_dir = tmp_path / "run"
    more = ["--config", "seqvec-tiny", *(["--stream"] if stream else [])]
    assert cli_main(train_arguments(text, output_dir, tmp_path, *more)) == 0
    config = ElmoConfig.from_pretrained(output_dir)
    tiny = ElmoConfig.from_preset("seqvec-tiny")
    assert (config.filters, config.n_highway, config.cell_dim) == (tiny.filters, 2, 64)
    words = ElmoTokenizer.from_pretrained(output_dir).word_vocabulary
    assert list(words) == RESIDUE_VOCAB.read_text().split() and config.vocab_size == 28  # SeqVec's n_tokens_vocab
    state = json.loads((output_dir / "checkpoint-3/trainer_state.json").read_text())
    assert all(np.isfinite(entry["loss"]) for entry in state["log_history"] if "loss" in entry)
    # The same run from the FASTA file itself: the same weights.
    fasta_run = tmp_path / "fasta-run"
    arguments = train_arguments(tmp_path / "family.fasta", fasta_run, tmp_path, *more)
    arguments.remove("--split"), arguments.remove("whitespace")
    assert cli_main([*arguments, "--fasta"]) == 0
    from_text, from_fasta = ElmoModel.from_pretrained(output_dir), ElmoModel.from_pretrained(fasta_run)
    assert all(torch.equal(value, from_fasta.state_dict()[name]) for name, value in from_text.state_dict().items())


def test_a_converted_seqvec_continues_training_on_a_protein_family(seqvec_shaped_models, tmp_path):
    options_file, weight_file = seqvec_shaped_models["small"]
    converted = tmp_path / "seqvec-hf"
    convert = ["convert", "--options", str(options_file), "--weights", str(weight_file), "--output-dir"]
    assert cli_main([*convert, str(converted)]) == 0
    output_dir = tmp_path / "family"
    text = protein_corpus(tmp_path)
    assert cli_main(train_arguments(text, output_dir, tmp_path, "--init-from", str(converted))) == 0
    before, after = ElmoModel.from_pretrained(converted), ElmoModel.from_pretrained(output_dir)
    assert after.config.cell_dim == before.config.cell_dim == SMALL_OPTIONS["lstm"]["dim"]
    moved = [name for name, value in before.state_dict().items() if not torch.equal(value, after.state_dict()[name])]
    assert moved, "three steps on the family should move the biLM"


def test_a_non_finite_vector_after_the_fallback_names_its_own_protein(seqvec_shaped_models, tmp_path):
    write_proteins(tmp_path / "in.fasta")
    embedder = limited_embedder(seqvec_shaped_models)
    embedder.limit = 20  # the batch runs out of memory: proteins go one at a time, the longest on the CPU

    class Poisoned(GpuOfLimitedMemory):
        def __call__(self, sentences, carry_state=False):
            if "".join(sentences[0]) == PROTEINS["same_length_b"]:
                raise NonFiniteVectors(0, float("nan"), torch.float32, torch.float32)
            return super().__call__(sentences, carry_state)

    embedder.__class__ = Poisoned
    fallback = OutOfMemoryFallback(embedder, cpu_fallback=True, report=lambda message: None)
    with pytest.raises(ElmoInputError, match=r"record 'same_length_b' \(line 9\): the model, running in float32"):
        embed_fasta(embedder, read_fasta(tmp_path / "in.fasta"), "in.fasta", tmp_path / "r.h5", embed_batch=fallback)


def test_a_stopped_run_resumes_to_the_files_of_an_uninterrupted_one(seqvec_shaped_models, tmp_path):
    proteins, _ = write_proteins(tmp_path / "in.fasta")
    records = read_fasta(tmp_path / "in.fasta")
    embedder = limited_embedder(seqvec_shaped_models)
    embedder.limit = 10**9
    outputs = {name: (tmp_path / f"{name}.h5", tmp_path / f"{name}-proteins.h5") for name in ("whole", "resumed")}
    run = {"model": "small", "layers": "sum"}
    embed_fasta(embedder, records, tmp_path / "in.fasta", *outputs["whole"], residue_budget=60, run=run)
    batches, reports = [], []

    def stop_after_two_batches(residues):
        batches.append(residues)
        if len(batches) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        embed_fasta(
            embedder,
            records,
            tmp_path / "in.fasta",
            *outputs["resumed"],
            residue_budget=60,
            run=run,
            on_batch=stop_after_two_batches,
            report=reports.append,
        )
    assert not outputs["resumed"][0].exists() and not outputs["resumed"][1].exists()
    partials = [partial_path(path) for path in outputs["resumed"]]
    assert reports == [
        f"stopped: the proteins embedded so far are kept in {partials[0]}, {partials[1]}; the same command with "
        "--resume continues"
    ]
    with h5py.File(partials[0]) as kept:
        first_two = set(kept)
    assert 0 < len(first_two) < len(proteins)
    for other_run, message in [
        ({"model": "small", "layers": "all"}, "written by another run"),
        (run, "an interrupted run's vectors; pass --resume"),
    ]:
        with pytest.raises(ElmoInputError, match=message):
            embed_fasta(
                embedder, records, tmp_path / "in.fasta", *outputs["resumed"], run=other_run, resume=other_run != run
            )
    computed = []
    embed_fasta(
        embedder, records, tmp_path / "in.fasta", *outputs["resumed"], run=run, resume=True, on_batch=computed.append
    )
    assert computed[0] == sum(len(proteins[name]) for name in first_two)  # counted, not computed again
    assert not any(partial.exists() for partial in partials)
    for whole, resumed in zip(outputs["whole"], outputs["resumed"]):
        with h5py.File(whole) as expected, h5py.File(resumed) as got:
            assert set(got) == set(expected) == set(proteins)
            for name in proteins:
                assert got[name].attrs["header"] == expected[name].attrs["header"]
                assert np.abs(got[name][...] - expected[name][...]).max() <= layer_bound(expected[name][...]), name
    with pytest.raises(ElmoInputError, match="no interrupted run to resume"):
        embed_fasta(embedder, records, tmp_path / "in.fasta", *outputs["resumed"], run=run, resume=True, force=True)


def test_a_damaged_partial_file_is_refused_in_one_line(seqvec_shaped_models, tmp_path):
    write_proteins(tmp_path / "in.fasta")
    partial_path(tmp_path / "r.h5").write_bytes(b"\x89HDF\r\n\x1a\n cut short by kill -9")
    embedder = limited_embedder(seqvec_shaped_models)
    records = read_fasta(tmp_path / "in.fasta")
    with pytest.raises(
        ElmoInputError, match=r"\.r\.h5\.partial: cannot resume from it \(.*\); remove it to start again"
    ):
        embed_fasta(embedder, records, tmp_path / "in.fasta", tmp_path / "r.h5", resume=True)
