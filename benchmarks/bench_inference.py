"""Inference throughput of ElmoModel with random weights: words per second (boundaries not counted).

    python benchmarks/bench_inference.py --sizes small original --batch-sizes 32 --words 20 --threads 2
    python benchmarks/bench_inference.py --compare                 # fast path vs the reference, alternating
    python benchmarks/bench_inference.py --dtype bfloat16 --quality  # bf16 weights; cosine to float32 per layer
    python benchmarks/bench_inference.py --autocast bfloat16 --quality  # float32 weights, bf16 autocast
    python benchmarks/bench_inference.py --document-words 5000      # a long document in chunks, state carried

Each sentence is `--words` random words of 3-10 lowercase letters; all layers are computed, as a user
embedding text would. Prints the machine and a table: words/s, seconds per batch (median of `--repeats`)
and peak memory above the loaded model during one batch (CUDA allocator peak on GPU; peak resident set
size on Linux CPUs, which also counts allocator caching). `--compare` runs the straightforward reference
path (`ElmoPaths.reference()`) on the same weights in the same process, alternating with the
fast path, and prints the ratio of their median times.
"""

import argparse
import copy
import ctypes
import datetime
import os
import platform
import random
import string
import time
from functools import partial

import torch

from hf_elmo import ElmoConfig, ElmoModel, ElmoPaths, ElmoTokenizer
from hf_elmo.character_rows import words_to_char_ids


def reference_copy(model):
    """A copy of `model` (same weights, dtype, device and mode) computing with the straightforward reference path."""
    reference = copy.deepcopy(model)
    reference.config.paths = ElmoPaths.reference().to_dict()
    return reference


VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "asimd", "sve")


def machine_description(device: str) -> str:
    """Processor (with the vector instructions that decide CPU speed), cores, torch, threads, GPU, load, time."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        cpu = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        flags = set(next(line for line in info.splitlines() if line.startswith(("flags", "Features"))).split())
        cpu += f" ({' '.join(flag for flag in VECTOR_FLAGS if flag in flags) or 'no AVX2'})"
    except (OSError, StopIteration):
        pass
    text = f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"
    if device.startswith("cuda"):
        text += f", {torch.cuda.get_device_name(device)}"
    if hasattr(os, "getloadavg"):
        text += f", load average {os.getloadavg()[0]:.1f} at start"
    return f"{text}; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"


def random_sentences(batch_size: int, words: int, seed: int = 0) -> list[list[str]]:
    rng = random.Random(seed)
    return [
        ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 10))) for _ in range(words)]
        for _ in range(batch_size)
    ]


def random_model(config: ElmoConfig, device: str, dtype: torch.dtype) -> ElmoModel:
    with torch.device("meta"):
        model = ElmoModel(config)
    model = model.to_empty(device=device)
    generator = torch.Generator(device="cpu").manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():  # timing only needs plausible magnitudes, not a careful init
            param.copy_(torch.randn(param.shape, generator=generator) / param.shape[-1] ** 0.5)
    return model.to(dtype).eval()


def _synchronize(device: str):
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _resident_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


class PeakMemory:
    """Peak memory above the level at entry while the block runs, in MiB (`None` where it cannot be read)."""

    def __init__(self, device: str):
        self.device, self.mib = device, None

    def __enter__(self):
        _synchronize(self.device)
        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
        else:
            try:
                # Hand freed heap memory back first so that it is not counted as in use at the start, then
                # reset the peak resident set size (writing 5 to clear_refs, Linux >= 4.0).
                ctypes.CDLL("libc.so.6").malloc_trim(0)
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
                self.start = _resident_kib("VmRSS") * 1024
            except OSError:  # not Linux with glibc
                self.start = None
        return self

    def __exit__(self, *exc):
        _synchronize(self.device)
        if self.device.startswith("cuda"):
            self.mib = (torch.cuda.max_memory_allocated(self.device) - self.start) / 2**20
        elif self.start is not None:
            self.mib = (_resident_kib("VmHWM") * 1024 - self.start) / 2**20


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
"""`cpu` counts the processor time of this process only: with one thread on a busy machine, a stable estimate of
the wall time on a quiet one (with more threads it also counts threads waiting for each other)."""


def time_alternating(
    paths: dict, repeats: int, warmup: int, device: str, clock: str = "wall"
) -> dict[str, list[float]]:
    """Seconds per call of each path, the paths taking turns so that load changes hit all of them alike."""
    now = CLOCKS[clock]
    times = {name: [] for name in paths}
    for i in range(warmup + repeats):
        for name, run in paths.items():
            _synchronize(device)
            start = now()
            run()
            _synchronize(device)
            if i >= warmup:
                times[name].append(now() - start)
    return times


def add_common_arguments(parser: argparse.ArgumentParser):
    """The options both benchmarks take: threads, device, autocast, clock, repeats, `--compare`."""
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--autocast", choices=["bfloat16", "float16"], help="run under torch.autocast to this dtype")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall", help="cpu: processor time (with --threads 1)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--compare", action="store_true", help="also time the reference path, alternating")
    parser.add_argument(
        "--also",
        nargs="+",
        metavar="FIELD=PATH",
        help="also time the model with these paths named (e.g. lstm_kernels=torch), alternating",
    )


def measure(calls: dict, args) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Peak memory (MiB, as text) of one call of each path, then seconds per call, the paths alternating."""
    peaks = {}
    for name, run in calls.items():
        with PeakMemory(args.device) as peak:
            run()
        peaks[name] = "n/a" if peak.mib is None else f"{peak.mib:.0f}"
    return time_alternating(calls, args.repeats, args.warmup, args.device, args.clock), peaks


def speedup(times: dict[str, list[float]]) -> str:
    pairwise = median([r / f for f, r in zip(times["fast"], times["reference"])])
    ratio = median(times["reference"]) / median(times["fast"])
    return f"fast / reference: {ratio:.2f}x (median of pairwise ratios {pairwise:.2f}x)"


def median(values: list[float]) -> float:
    values = sorted(values)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def layer_quality(full_model: ElmoModel, batch, low_layers) -> list[tuple[float, float, float]]:
    """Per layer: mean and minimum cosine over real tokens, and max abs difference, against the float32 model."""
    with torch.inference_mode():
        full_layers = full_model(**batch, output_hidden_states=True).hidden_states
    real = batch["attention_mask"].bool()
    result = []
    for full, low in zip(full_layers, low_layers):
        cosine = torch.nn.functional.cosine_similarity(full[real], low[real].float(), dim=-1)
        result.append((cosine.mean().item(), cosine.min().item(), (full[real] - low[real].float()).abs().max().item()))
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["small", "original"], choices=["small", "medium", "original"])
    parser.add_argument("--batch-sizes", "--batch-size", nargs="+", type=int, default=[32])
    parser.add_argument("--words", type=int, default=20, help="words per sentence")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weights")
    add_common_arguments(parser)
    parser.add_argument("--quality", action="store_true", help="cosine of each layer to the float32 output")
    parser.add_argument("--profile", action="store_true", help="print where the fast path's time goes (torch.profiler)")
    parser.add_argument("--document-words", type=int, default=0, help="also embed one document this long in chunks")
    parser.add_argument("--chunk-words", type=int, default=500)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    autocast = (
        torch.autocast(args.device.split(":")[0], dtype=getattr(torch, args.autocast))
        if args.autocast
        else torch.autocast(args.device.split(":")[0], enabled=False)
    )
    print(f"machine: {machine_description(args.device)}")
    print(
        f"{args.words} words per sentence, weights {args.dtype}, autocast {args.autocast or 'off'}, {args.device}, "
        f"{args.clock} clock, median of {args.repeats} after {args.warmup} warm-up"
    )
    print(f"{'size':<10}{'batch':>6}  {'path':<10}{'words/s':>10}{'s/batch':>10}{'peak MiB':>10}")
    tokenizer = ElmoTokenizer()
    for size in args.sizes:
        # Frozen, as `hf-elmo embed` freezes its model (the CPU loop keeps a frozen model's packed panels).
        model = random_model(ElmoConfig.from_preset(size), args.device, dtype).requires_grad_(False)
        paths = {"fast": model}
        if args.compare:
            paths["reference"] = reference_copy(model).eval()
        if args.also:
            paths["also"] = copy.deepcopy(model)
            paths["also"].config.paths = {**model.config.paths, **dict(item.split("=", 1) for item in args.also)}
        for batch_size in args.batch_sizes:
            batch = tokenizer(
                random_sentences(batch_size, args.words), is_split_into_words=True, padding=True, return_tensors="pt"
            ).to(args.device)
            calls = {"fast": partial(model, **batch, output_hidden_states=True)}
            if args.compare:
                calls["reference"] = partial(paths["reference"], **batch, output_hidden_states=True)
            if args.also:
                calls["also"] = partial(paths["also"], **batch, output_hidden_states=True)
            with torch.inference_mode(), autocast:
                times, peaks = measure(calls, args)
            for name, seconds in times.items():
                words_per_second = batch_size * args.words / median(seconds)
                print(
                    f"{size:<10}{batch_size:>6}  {name:<10}{words_per_second:>10,.0f}"
                    f"{median(seconds):>10.3f}{peaks[name]:>10}"
                )
            if args.compare:
                print(f"{'':<18}{speedup(times)}")
            if args.profile:
                print_profile(calls["fast"], args.device, autocast)
            if args.quality and (dtype != torch.float32 or args.autocast):
                with torch.inference_mode(), autocast:
                    low_layers = model(**batch, output_hidden_states=True).hidden_states
                full_model = random_model(ElmoConfig.from_preset(size), args.device, torch.float32)
                for layer, (mean, low, diff) in enumerate(layer_quality(full_model, batch, low_layers)):
                    print(
                        f"{'':<16}  layer {layer}: cosine to float32 mean {mean:.5f}, min {low:.5f}, "
                        f"max abs diff {diff:.3g}"
                    )
                del full_model
        if args.document_words:
            embed_document(model, args, autocast)


def print_profile(run, device: str, autocast, rows: int = 12):
    """The operators taking the most time in one call, grouped by input shapes."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.inference_mode(), autocast:
        run()
        with torch.profiler.profile(activities=activities, record_shapes=True) as profile:
            run()
            _synchronize(device)
    sort_by = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    print(
        profile.key_averages(group_by_input_shape=True).table(
            sort_by=sort_by, row_limit=rows, max_name_column_width=30, max_shapes_column_width=60
        )
    )


def embed_document(model: ElmoModel, args, autocast):
    """One document of `--document-words` random words, embedded `--chunk-words` at a time with the state
    carried from chunk to chunk (one row), so memory depends on the chunk, not on the document."""
    words = [word for sentence in random_sentences(1, args.document_words, seed=1) for word in sentence]
    ids = torch.from_numpy(words_to_char_ids(words)).to(args.device)[None]
    state, vectors = None, 0
    with torch.inference_mode(), autocast, PeakMemory(args.device) as peak:
        _synchronize(args.device)
        start = time.perf_counter()
        for begin in range(0, len(words), args.chunk_words):
            out = model(
                ids[:, begin : begin + args.chunk_words], state=state, use_cache=True, output_hidden_states=True
            )
            state, vectors = out.state, vectors + out.last_hidden_state.shape[1]
        _synchronize(args.device)
        seconds = time.perf_counter() - start
    assert vectors == len(words)
    peak_text = "n/a" if peak.mib is None else f"{peak.mib:.0f}"
    print(
        f"document of {len(words):,} words in chunks of {args.chunk_words}, state carried: "
        f"{len(words) / seconds:,.0f} words/s, peak {peak_text} MiB"
    )


if __name__ == "__main__":
    main()
