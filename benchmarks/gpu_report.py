"""One report of ELMo on a CUDA GPU: exactness, training and inference throughput, GPU-busy share.

    python benchmarks/gpu_report.py                 # everything, under 8 minutes on one H100
    python benchmarks/gpu_report.py --quick         # fewer shapes and steps, for a first look
    python benchmarks/gpu_report.py --output report.txt   # also each table into a file as soon as it is measured
    python benchmarks/gpu_report.py --sections training --batches 1024   # the issue's second training target

Sections, each printed as a table (and all of them again at the end):
1. Exactness: the GPU path in float32 against a float64 CPU run of the straightforward reference, all layers and
   the gradient of every parameter; both converted fixture models against the original implementations' outputs
   (10 batches, state carried); bfloat16 autocast's cosine to float64.
2. Training: tokens/s per direction (batch x 20 positions / median step time) of `ElmoForBiLM` with the sampled
   softmax (8,192 negatives of 100,000 words), dropout 0.1, clipping and Adagrad, for the small and original
   sizes, batches 128 / 512 / 2,048, float32 and bfloat16 autocast; the GPU path ("static") against the
   length-sorted path made for CPUs ("sorted") and the straightforward reference ("reference"); where the GPU path
   multiplies each step's input together with its state (from batch 512 at the original size), also "static, state
   product", the GPU path without that (one product of all steps' inputs first); "static, characters not fused", the
   GPU path without the character encoder's kernels (the max over the windows taken as they are multiplied; the
   highway layers); in bfloat16 also "static, steps not fused", without the step kernel that holds its product;
   and "static, streams", the original's recipe (`hf-elmo train --stream`): batch continuous streams per direction,
   every position a target, the state carried from step to step, each LSTM stack on its own rows.
3. Inference: words/s of `ElmoModel` (all layers), float32 and bfloat16 weights, the same paths; and (3a, run last)
   the character encoder alone, forward and backward, with its fused kernels and without.
4. Profile of a training step at batch 128 (original size): tokens/s with a synchronisation after each step and with
   steps issued back to back (the host running ahead, as in training), the share of the step in which a kernel runs,
   kernels per step and launch calls per step, for the benchmark loop and for `Trainer` (`hf_elmo.commands.train` on a
   generated corpus, with the host's time to read and collate one of its batches); and for the GPU path's loop,
   where the kernel time of a step goes (matrix products, the LSTM's elementwise kernels, Adagrad, copies, ...);
   the same for an inference batch at the bfloat16 inference target's batch (4,096 x 20).
"""

import argparse
import copy
import math
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_data_loading import batch_read_ms  # noqa: E402
from bench_inference import machine_description, random_model, random_sentences, reference_copy  # noqa: E402
from bench_training import make_batch  # noqa: E402

from hf_elmo import ElmoConfig, ElmoForBiLM, ElmoPaths, ElmoTokenizer  # noqa: E402
from hf_elmo.lstm_static import joint_input_product  # noqa: E402
from hf_elmo.training.adagrad import Adagrad  # noqa: E402

DEVICE = "cuda"
TABLES: list[str] = []
OUTPUT: Path | None = None  # --output: each table appended as soon as it is measured (a run cut short keeps them)
KERNEL_TABLES = 0  # --kernels N: also print the N costliest operations of each profiled step
TRACES: Path | None = None  # --traces FOLDER: with --kernels, each profiled step's torch.profiler trace there
PATHS = ["static", "sorted", "reference"]
BATCHES = None
SIZES = ["small", "original"]
PROFILE_BATCHES = [128]
CHAR_CNN_BATCHES = (128, 4096)
INFERENCE_PROFILE_BATCH = 4096  # where the bfloat16 inference target was measured


def table(title: str, header: list[str], rows: list[list]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    lines = [title, "  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(str(x).rjust(w) for x, w in zip(row, widths)) for row in rows]
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    record(text)
    return text


def record(text: str):
    """Keeps `text` for the summary at the end, and writes it into `--output` at once."""
    TABLES.append(text)
    if OUTPUT is not None:
        with OUTPUT.open("a", encoding="utf-8") as output:
            output.write(text + "\n")


def set_path(model, path: str):
    """`static` (the GPU path), `sorted` (the CPU path) on an `ElmoModel` or `ElmoForBiLM`; `static, state product`:
    the GPU path with each step multiplying only its state, after one product of all steps' inputs, also where the
    batch is large enough for the joint product of input and state (`lstm_static.joint_input_product`); `static, joint
    product`: the joint product at any batch size; `static, steps fused` / `static, steps not fused`: each step's
    product inside the Triton kernel or not, whatever a captured layer would find faster; `static, windows not
    fused`: the character CNN's window products written out before their max and the highway layers' elementwise
    part as PyTorch operations (instead of `char_cnn_triton.py`'s kernels)."""
    characters = "torch" if path == "static, characters not fused" else "auto"
    # Off a GPU (the suite's run of this report, Triton interpreted) the static path's steps are PyTorch's either way.
    on_gpu = next(model.parameters()).is_cuda
    steps = {"static, steps not fused": "triton_unfused", "static, steps fused": "triton_fused"} if on_gpu else {}
    joint = {"static, state product": "separate", "static, joint product": "joint"}
    model.config.paths = {
        "char_cnn": "distinct_words" if path == "sorted" else "every_word",
        "window_max": characters,
        "highway": characters,
        "lstm": "static" if path.startswith("static") else "sorted",
        "lstm_kernels": steps.get(path, "auto"),
        "joint_input_product": joint.get(path, "auto"),
    }
    return model


def steps_fused(model) -> str:
    """Whether the captured LSTM layers of `model` run each step's product inside the Triton kernel (they time both
    ways when captured and keep the faster): yes, no, both (some layers or shapes one way, some the other), or -."""
    elmo = model.elmo if hasattr(model, "elmo") else model
    choices = {entry.settings.fused_gates for entry in elmo.encoder.captured.entries.values()}
    return {frozenset(): "-", frozenset({True}): "yes", frozenset({False}): "no"}.get(frozenset(choices), "both")


def with_unfused(paths: list[str], dtype: str) -> list[str]:
    """`paths`, with `static, steps not fused` (16-bit products, where that kernel applies) and `static, characters
    not fused` after `static`."""
    if "static" in paths:
        at = paths.index("static") + 1
        unfused = ["static, steps not fused"] if dtype in ("bfloat16", "torch.bfloat16") else []
        paths = [*paths[:at], *unfused, "static, characters not fused", *paths[at:]]
    return paths


def paths_for(batch_size: int, paths: list[str], projection_dim: int) -> list[str]:
    """`paths`, with `static, state product` after `static` where the GPU path would take the joint product."""
    if "static" in paths and joint_input_product(batch_size, projection_dim):
        paths = list(paths)
        paths.insert(paths.index("static") + 1, "static, state product")
    return paths


# --- 1. exactness ---------------------------------------------------------------------------------------------


def exactness(quick: bool):
    """Each GPU path against the model's reference path in float64 on the CPU, on random weights. (The original
    implementations' fixtures on the GPU are the suite's `tests/model/test_lstm_static.py`, which `gpu_targets.sh` runs
    first.)"""
    rows = []
    config = ElmoConfig.from_preset("small")
    cpu_model = random_model(config, "cpu", torch.float64)
    sentences = random_sentences(16, 12, seed=1)
    sentences = [s[: 3 + (i * 5) % 10] for i, s in enumerate(sentences)]  # unequal lengths: padding
    batch = ElmoTokenizer()(sentences, is_split_into_words=True, padding=True, return_tensors="pt")
    reference = reference_copy(cpu_model)
    truth_layers = reference(**batch, output_hidden_states=True).hidden_states
    weights = [
        torch.randn(t.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) for t in truth_layers
    ]
    sum((w * t).sum() for w, t in zip(weights, truth_layers)).backward()
    truth_grads = {n: p.grad for n, p in reference.named_parameters()}
    truth_layers = [t.detach() for t in truth_layers]
    gpu_batch = {k: v.to(DEVICE) for k, v in batch.items()}
    for path in ("static", "static, joint product", "sorted", "reference"):
        model = copy.deepcopy(cpu_model).float().to(DEVICE)
        model = reference_copy(model) if path == "reference" else set_path(model, path)
        layers = model(**gpu_batch, output_hidden_states=True).hidden_states
        value_error = max(float((a.detach().double().cpu() - b).abs().max()) for a, b in zip(layers, truth_layers))
        sum((w.to(DEVICE).float() * t).sum() for w, t in zip(weights, layers)).backward()
        grad_error = max(
            float((p.grad.double().cpu() - truth_grads[n]).abs().max() / truth_grads[n].abs().max())
            for n, p in model.named_parameters()
        )
        rows.append([f"small, random weights, {path}, float32", f"{value_error:.1e}", f"{grad_error:.1e}"])
    mask = batch["attention_mask"].bool()
    for path in ("static", "static, steps fused", "static, characters not fused"):
        model = set_path(copy.deepcopy(cpu_model).float().to(DEVICE), path)
        with torch.autocast(DEVICE, dtype=torch.bfloat16), torch.no_grad():
            layers = model(**gpu_batch, output_hidden_states=True).hidden_states
        cosines = [
            float(torch.nn.functional.cosine_similarity(a.double().cpu()[mask], b[mask], dim=-1).mean())
            for a, b in zip(layers, truth_layers)
        ]
        rows.append(
            [f"small, bfloat16 autocast, {path}: mean cosine per layer", " / ".join(f"{c:.5f}" for c in cosines), ""]
        )
    table(
        "1. Exactness on the GPU (max abs difference; gradients: max abs / max abs of float64)",
        ["what", "values", "gradients"],
        rows,
    )


# --- 2. training ----------------------------------------------------------------------------------------------


def training_model(size: str, path: str, vocab_size: int = 100_000, samples: int = 8192):
    torch.manual_seed(0)
    config = ElmoConfig.from_preset(size, vocab_size=vocab_size, num_softmax_samples=samples, dropout=0.1)
    with torch.device(DEVICE):
        model = ElmoForBiLM(config).train()
    if path == "reference":
        model.config.paths = ElmoPaths.reference().to_dict()
    else:
        set_path(model, path)
    optimizer = Adagrad(model.parameters(), lr=0.2, initial_accumulator_value=1.0 / 20**2)
    return model, optimizer


def train_step(model, optimizer, batch, dtype, carried: list | None = None):
    """One training step; `carried` (a one-element list, `[None]` at first) for stream batches: each direction's rows
    only, the state carried from the step before, as `StreamTrainer` does."""
    stream = {} if carried is None else {"state": carried[0], "use_cache": True, "split_directions": True}
    with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
        outputs = model(**batch, **stream)
    if carried is not None:
        carried[0] = tuple(t.detach() for t in outputs.state)
    outputs.loss.backward()
    optimizer.clip_grad_norm_(10.0 / 20)  # clipped inside the step, as hf-elmo train does
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def stream_batch(batch_size: int, vocab_size: int) -> dict:
    """A batch of `hf-elmo train --stream` (the original's recipe): `batch_size` forward rows then `batch_size` backward
    rows of 20 positions, every position a target of its direction."""
    batch = make_batch(2 * batch_size, 20, vocab_size, DEVICE)
    ids = np.minimum(np.random.default_rng(1).zipf(1.1, size=(2 * batch_size, 20)) - 1, vocab_size - 1)
    labels = torch.from_numpy(ids)
    batch["labels"] = torch.full((2 * batch_size, 20, 2), -100, dtype=torch.long)
    batch["labels"][:batch_size, :, 0] = labels[:batch_size]
    batch["labels"][batch_size:, :, 1] = labels[batch_size:]
    batch["labels"] = batch["labels"].to(DEVICE)
    return batch


def host_checked_step(model, optimizer, host_batch, dtype):
    """A step as `hf-elmo train` takes it on a GPU: the batch (pinned host memory) checked on the host, moved without
    waiting, and the model's device-side checks of values (each a wait for the GPU) skipped."""
    model.check_batch(**host_batch)
    batch = {k: v.to(DEVICE, non_blocking=True) for k, v in host_batch.items()}
    train_step(model, optimizer, {**batch, "values_checked_on_host": True}, dtype)


def time_back_to_back(step, steps: int) -> float:
    """Seconds per step of `steps` steps issued one after the other, synchronised only at the end (the host may
    run ahead of the GPU, as in training)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def time_steps(step, steps: int, warmup: int) -> float:
    """Median seconds per step, each timed between synchronisations."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def training(quick: bool, deadline: float):
    rows = []
    batches = BATCHES or ([128, 512] if quick else [128, 512, 2048])
    for size in SIZES:
        for batch_size in batches:
            batch = make_batch(batch_size, 20, 100_000, DEVICE)
            for dtype in ("bfloat16", "float32"):
                projection_dim = ElmoConfig.from_preset(size).projection_dim
                paths = with_unfused(paths_for(batch_size, PATHS, projection_dim), dtype)
                if "static" in paths:  # the original's recipe: continuous streams, the state carried
                    paths.insert(paths.index("static") + 1, "static, streams")
                for path in paths:
                    if time.monotonic() > deadline:
                        rows.append([size, batch_size, dtype, path, "skipped (time)", "", ""])
                        continue
                    if not path.startswith("static") and batch_size == 2048 and size == "original":
                        rows.append([size, batch_size, dtype, path, "not run (time)", "", ""])
                        continue
                    if path == "static, streams":
                        model, optimizer = training_model(size, "static")
                        streams, carried = stream_batch(batch_size, model.config.vocab_size), [None]
                        step = partial(train_step, model, optimizer, streams, dtype, carried)
                    else:
                        model, optimizer = training_model(size, path)
                        step = partial(train_step, model, optimizer, batch, dtype)
                    seconds = time_steps(step, 3 if quick else 6, 3)
                    rows.append(
                        [
                            size,
                            batch_size,
                            dtype,
                            path,
                            f"{batch_size * 20 / seconds:,.0f}",
                            f"{seconds * 1e3:.1f}",
                            steps_fused(model),
                        ]
                    )
                    del model, optimizer
                    torch.cuda.empty_cache()
    table(
        "2. Training throughput (tokens/s per direction, as bilm-tf counts; median ms per step; steps fused: whether "
        "the captured LSTM layers chose the fused step kernel)",
        ["size", "batch", "dtype", "path", "tokens/s", "ms/step", "steps fused"],
        rows,
    )


# --- 3. inference ---------------------------------------------------------------------------------------------


def inference_run(model, batch_size: int):
    """A function that runs `model` on `batch_size` random sentences of 20 words, all layers, without autograd."""
    encoded = ElmoTokenizer()(
        random_sentences(batch_size, 20), is_split_into_words=True, padding=True, return_tensors="pt"
    )
    encoded = {k: v.to(DEVICE) for k, v in encoded.items()}

    def run():
        with torch.inference_mode():
            model(**encoded, output_hidden_states=True)

    return run


def inference(quick: bool, deadline: float):
    rows = []
    config = ElmoConfig.from_preset("original")
    for dtype, batches in ((torch.float32, [32, 256, 1024]), (torch.bfloat16, [32, 256, 1024, 4096])):
        for path in (
            "static",
            "static, steps not fused",
            "static, characters not fused",
            "static, state product",
            "sorted",
        ):
            if path.split(",")[0] not in PATHS:
                continue
            model = set_path(random_model(config, DEVICE, dtype), path)
            for batch_size in batches:
                if path not in with_unfused(
                    paths_for(batch_size, ["static", "sorted"], config.projection_dim), str(dtype)
                ):
                    continue
                if time.monotonic() > deadline:
                    rows.append([str(dtype).split(".")[1], path, batch_size, "skipped (time)", "", ""])
                    continue
                run = inference_run(model, batch_size)
                seconds = time_steps(run, 5 if quick else 10, 3)
                rows.append(
                    [
                        str(dtype).split(".")[1],
                        path,
                        batch_size,
                        f"{batch_size * 20 / seconds:,.0f}",
                        f"{seconds * 1e3:.1f}",
                        steps_fused(model),
                    ]
                )
                model.encoder.captured.clear()  # each batch size's graphs (and their choice) on their own
            del model
            torch.cuda.empty_cache()
    table(
        "3. Inference, original size, all layers (words/s, boundaries not counted; median ms per batch; steps fused "
        "as in 2.)",
        ["weights", "path", "batch", "words/s", "ms/batch", "steps fused"],
        rows,
    )


def char_cnn(quick: bool, deadline: float):
    """The character encoder alone (original size, float32 weights under bfloat16 autocast): its fused kernels (window
    products and their max, highway layers) against PyTorch's operations, on the benchmark's words and on text where
    one word in 1,000 fills all slots."""
    rows = []
    encoder = random_model(ElmoConfig.from_preset("original"), DEVICE, torch.float32).char_encoder
    for batch_size in CHAR_CNN_BATCHES:
        for text in ("words of 3-10 letters", "and 1 in 1,000 of 48"):
            sentences = random_sentences(batch_size, 20)
            if text != "words of 3-10 letters":
                for k in range(0, batch_size * 20, 1000):
                    sentences[k // 20][k % 20] = "x" * 48
            ids = ElmoTokenizer()(sentences, is_split_into_words=True, return_tensors="pt")["input_ids"].to(DEVICE)
            for way, kernels in (("fused", "auto"), ("not fused", "torch")):
                if time.monotonic() > deadline:
                    rows.append([ids.shape[0] * ids.shape[1], text, way, "skipped (time)", ""])
                    continue
                encoder.config.paths = {"window_max": kernels, "highway": kernels}

                def forward(ids=ids):
                    with torch.inference_mode(), torch.autocast(DEVICE, dtype=torch.bfloat16):
                        encoder(ids)

                def forward_backward(ids=ids):
                    with torch.autocast(DEVICE, dtype=torch.bfloat16):
                        out = encoder(ids)
                    out.float().sum().backward()

                times = [time_steps(step, 5 if quick else 10, 2) * 1e3 for step in (forward, forward_backward)]
                rows.append([ids.shape[0] * ids.shape[1], text, way, f"{times[0]:.2f}", f"{times[1]:.2f}"])
    encoder = None  # its memory back before the next section
    torch.cuda.empty_cache()
    table(
        "3a. The character encoder alone, original size, bfloat16 autocast (median ms; words counted with the boundary "
        "rows)",
        ["words", "text", "kernels", "forward", "forward + backward"],
        rows,
    )


# --- 4. profile -------------------------------------------------------------------------------------------------

_LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaGraphLaunch")


def busy_share(profiler, wall_seconds: float, steps: int) -> tuple[float, float, float]:
    """(share of the wall time in which some kernel runs, kernels per step, launch calls per step)."""
    intervals, launches = [], 0
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            intervals.append((event.time_range.start, event.time_range.end))
        elif event.name in _LAUNCH_CALLS:
            launches += 1
    intervals.sort()
    busy, end = 0.0, -math.inf
    for start, stop in intervals:
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy / 1e6 / wall_seconds, len(intervals) / steps, launches / steps


# Kernel names -> what they do, first match wins (cuBLAS and CUTLASS kernel names vary by version and shape).
KERNEL_KINDS = [
    (
        "LSTM steps, elementwise (Triton)",
        ("_cell_forward_kernel", "_hidden_forward_kernel", "_hidden_backward_kernel", "_cell_backward_kernel"),
    ),
    ("Adagrad (Triton)", ("_adagrad_kernel",)),
    ("sampled softmax log-sum-exp (Triton)", ("logsumexp",)),
    ("character CNN (Triton)", ("_window_max_kernel", "_weight_grad_kernel", "_chars_grad_kernel", "_highway_")),
    ("matrix products", ("gemm", "gemv", "nvjet", "cutlass", "xmma", "splitkreduce", "cublas")),
    ("copies and casts", ("memcpy", "memset", "copy_kernel", "copy_")),
    ("reductions (norms, sums, max)", ("reduce_kernel", "norm", "max_kernel")),
    ("sorting, scatter, gather, indexing", ("sort", "radix", "scatter", "gather", "index")),
    ("other elementwise", ("elementwise", "fill")),
]


def kernel_kind(name: str) -> str:
    name = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(key in name for key in keys)), "other")


def kernel_kinds(profiler, steps: int) -> list[list]:
    """Rows `[kind, ms per step, share of kernel time, kernels per step]`, costliest first, from a profile's kernels."""
    totals: dict[str, list[float]] = {}
    for event in profiler.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        kind = kernel_kind(event.name)
        total = totals.setdefault(kind, [0.0, 0])
        total[0] += (event.time_range.end - event.time_range.start) / 1e3  # us -> ms
        total[1] += 1
    overall = sum(t[0] for t in totals.values()) or 1.0
    rows = sorted(totals.items(), key=lambda item: -item[1][0])
    return [[kind, f"{ms / steps:.2f}", f"{ms / overall:.0%}", f"{count / steps:,.0f}"] for kind, (ms, count) in rows]


def profile_steps(step, steps: int, label: str = "", kinds_title: str | None = None) -> tuple[float, float, float]:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(4):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    if kinds_title:
        table(kinds_title, ["kernels", "ms per step", "share", "kernels per step"], kernel_kinds(profiler, steps))
    if KERNEL_TABLES:
        print(f"--- {label}: kernels by GPU time over {steps} steps")
        print(
            profiler.key_averages().table(sort_by="cuda_time_total", row_limit=KERNEL_TABLES, max_name_column_width=90)
        )
        if TRACES is not None:
            profiler.export_chrome_trace(str(TRACES / f"trace-{label.replace(' ', '-').replace(',', '')}.json"))
    return busy_share(profiler, wall, steps)


def trainer_profile(dtype: str, steps: int = 30) -> list:
    """`hf_elmo.commands.train` on a generated corpus (original size, 100,000 words, batch 128): tokens/s over steps
    after the first ten, and a profiled window of five steps."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import TrainerCallback

    from hf_elmo.commands import train as training_module
    from hf_elmo.training.collator import DataCollatorForBiLM
    from hf_elmo.training.word_table import WordTable, load_compact_bilm_dataset
    from hf_elmo.word_vocabulary import read_word_vocabulary

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        words = [f"w{i}" for i in range(100_000 - 3)]
        (folder / "vocab.txt").write_text("\n".join(["<S>", "</S>", "<UNK>", *words]) + "\n")
        ids = np.minimum(rng.zipf(1.2, size=(20_000, 18)) - 1, len(words) - 1)
        (folder / "corpus.txt").write_text("\n".join(" ".join(words[i] for i in row) for row in ids) + "\n")

        class Timing(TrainerCallback):
            def __init__(self):
                self.times, self.profiler, self.profile = [], None, None

            def on_step_end(self, args, state, control, **kwargs):
                self.times.append(time.perf_counter())
                if state.global_step == 12:
                    torch.cuda.synchronize()
                    self.profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                    self.profiler.__enter__()
                    self.profile_start = time.perf_counter()
                elif state.global_step == 17:
                    torch.cuda.synchronize()
                    wall = time.perf_counter() - self.profile_start
                    self.profiler.__exit__(None, None, None)
                    self.profile = busy_share(self.profiler, wall, 5)

        timing = Timing()
        original_trainer = training_module.ElmoTrainer

        class TimedTrainer(original_trainer):
            def __init__(self, *args, callbacks=None, **kwargs):
                super().__init__(*args, callbacks=[*(callbacks or []), timing], **kwargs)

        training_module.ElmoTrainer = TimedTrainer
        try:
            training_module.train_bilm(
                output_dir=str(folder / "out"),
                train_files=[str(folder / "corpus.txt")],
                vocab=str(folder / "vocab.txt"),
                config="original",
                max_steps=steps,
                save_steps=10_000,
                logging_steps=10_000,
                bf16=dtype == "bfloat16",
                disable_tqdm=True,
                dataloader_num_workers=2,
            )
        finally:
            training_module.ElmoTrainer = original_trainer
        # The host's share of a step that the data loader workers take on: reading a batch of stored windows, as
        # ElmoTrainer does (the batch is made on the GPU).
        tokenizer = ElmoTokenizer()
        tokenizer.set_word_vocabulary(read_word_vocabulary(folder / "vocab.txt"))
        table = WordTable.of_files([folder / "corpus.txt"], tokenizer)
        windows = load_compact_bilm_dataset([folder / "corpus.txt"], table, tokenizer, 20, cache_dir=folder / "cache")
        read_ms = batch_read_ms(windows, 128, 20, DataCollatorForBiLM(words=table, stored_only=True))
    times = np.diff(timing.times[10:])
    tokens_per_second = 128 * 20 / float(np.median(times))
    share, kernels, launches = timing.profile
    return [
        f"Trainer (hf_elmo.commands.train), {dtype}",
        f"{tokens_per_second:,.0f}",
        f"{tokens_per_second:,.0f}",
        f"{share:.0%}",
        f"{kernels:,.0f}",
        f"{launches:,.0f}",
        f"{read_ms:.1f}",
    ]


def inference_profile(batch_size: int) -> list:
    """The bfloat16 inference target's batch (original size, static path, all layers): words/s, GPU busy, kernels and
    launch calls per batch, and where its kernel time goes."""
    model = set_path(random_model(ElmoConfig.from_preset("original"), DEVICE, torch.bfloat16), "static")
    run = inference_run(model, batch_size)
    seconds, back_to_back = time_steps(run, 5, 3), time_back_to_back(run, 10)
    title = f"4b. Where the GPU time of an inference batch goes: static, bfloat16 weights, batch {batch_size} x 20"
    share, kernels, launches = profile_steps(run, 5, f"inference static bfloat16 {batch_size}", title)
    return [
        f"inference (words/s), batch {batch_size}, static, bfloat16",
        f"{batch_size * 20 / seconds:,.0f}",
        f"{batch_size * 20 / back_to_back:,.0f}",
        f"{share:.0%}",
        f"{kernels:,.0f}",
        f"{launches:,.0f}",
        "",
    ]


def profiles(quick: bool, deadline: float):
    rows = []
    for batch_size in PROFILE_BATCHES:
        batch = make_batch(batch_size, 20, 100_000, DEVICE)
        for dtype in ("bfloat16", "float32"):
            host_batch = {k: v.cpu().pin_memory() for k, v in batch.items()}
            paths = [p for p in PATHS if p != "reference"]
            if "static" in paths:
                paths.insert(paths.index("static") + 1, "static, checked on host")
            for path in paths:
                model, optimizer = training_model("original", path.split(",")[0])
                if path == "static, checked on host":
                    step = partial(host_checked_step, model, optimizer, host_batch, dtype)
                else:
                    step = partial(train_step, model, optimizer, batch, dtype)
                seconds = time_steps(step, 5, 3)
                back_to_back = time_back_to_back(step, 10)
                kinds_title = None
                if path == "static":
                    where = f"benchmark loop, static, {dtype}, batch {batch_size} x 20"
                    kinds_title = f"4a. Where the GPU time of a step goes: {where}"
                share, kernels, launches = profile_steps(step, 5, f"{path} {dtype} {batch_size}", kinds_title)
                rows.append(
                    [
                        f"benchmark loop, batch {batch_size}, {path}, {dtype}",
                        f"{batch_size * 20 / seconds:,.0f}",
                        f"{batch_size * 20 / back_to_back:,.0f}",
                        f"{share:.0%}",
                        f"{kernels:,.0f}",
                        f"{launches:,.0f}",
                        "",
                    ]
                )
                model = optimizer = step = None  # their memory back before the next path
                torch.cuda.empty_cache()
    for dtype in ("bfloat16", "float32"):
        if time.monotonic() > deadline:
            rows.append([f"Trainer, {dtype}", "skipped (time)", "", "", "", "", ""])
            continue
        rows.append(trainer_profile(dtype))
    if time.monotonic() > deadline:
        rows.append([f"inference, batch {INFERENCE_PROFILE_BATCH}", "skipped (time)", "", "", "", "", ""])
    else:
        rows.append(inference_profile(INFERENCE_PROFILE_BATCH))
        torch.cuda.empty_cache()
    table(
        "4. A training step, rows of 20 positions, original size (GPU busy: share of the wall time with a kernel "
        "running)",
        [
            "what",
            "tokens/s",
            "back to back",
            "GPU busy",
            "kernels/step",
            "launch calls/step",
            "host ms to read a batch",
        ],
        rows,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    # The diagnostic section last: what the targets need runs first when the time limit cuts a run short.
    parser.add_argument("--sections", nargs="+", default=["exactness", "training", "inference", "profile", "char_cnn"])
    parser.add_argument("--minutes", type=float, default=7.5, help="skip what would start after this")
    parser.add_argument("--kernels", type=int, default=0, help="print the N costliest operations of profiled steps")
    parser.add_argument("--paths", nargs="+", default=["static", "sorted", "reference"])
    parser.add_argument("--batches", nargs="+", type=int, help="training batch sizes (default 128 512 2048)")
    parser.add_argument("--sizes", nargs="+", default=["small", "original"], help="training model sizes")
    parser.add_argument("--profile-batches", nargs="+", type=int, default=[128])
    parser.add_argument("--output", type=Path, help="also write each table into this file as soon as it is measured")
    parser.add_argument("--traces", type=Path, help="with --kernels: a torch.profiler trace of each profiled step here")
    args = parser.parse_args()
    global KERNEL_TABLES, PATHS, BATCHES, SIZES, PROFILE_BATCHES, OUTPUT, TRACES
    KERNEL_TABLES, PATHS, BATCHES, PROFILE_BATCHES = args.kernels, args.paths, args.batches, args.profile_batches
    TRACES, SIZES = args.traces, args.sizes
    if not torch.cuda.is_available():
        sys.exit("gpu_report.py needs a CUDA GPU.")
    start = time.monotonic()
    deadline = start + 60 * args.minutes
    machine = machine_description(DEVICE)
    print(f"machine: {machine}")
    if args.output is not None:
        args.output.write_text(f"machine: {machine}\n\n", encoding="utf-8")
        OUTPUT = args.output
    import transformers
    import triton

    print(
        f"transformers {transformers.__version__}, triton {triton.__version__}; TF32 for float32 products: "
        f"{torch.backends.cuda.matmul.allow_tf32} (matmul), {torch.backends.cudnn.allow_tf32} (cuDNN)\n"
    )
    sections = {
        "exactness": exactness,
        "training": training,
        "inference": inference,
        "char_cnn": char_cnn,
        "profile": profiles,
    }
    for name in args.sections:
        section_start = time.monotonic()
        try:
            if name == "exactness":
                sections[name](args.quick)
            else:
                sections[name](args.quick, deadline)
        except Exception as error:  # a report still prints what the other sections found
            import traceback

            traceback.print_exc()
            record(f"{name}: failed: {type(error).__name__}: {error}\n")
        print(f"[{name}: {time.monotonic() - section_start:.0f} s]", flush=True)
    print("=" * 100)
    print(f"machine: {machine}; total {time.monotonic() - start:.0f} s\n")
    print("\n".join(TABLES))
    if OUTPUT is not None:
        with OUTPUT.open("a", encoding="utf-8") as output:
            output.write(f"total {time.monotonic() - start:.0f} s\n")


if __name__ == "__main__":
    main()
