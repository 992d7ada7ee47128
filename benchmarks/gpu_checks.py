"""The GPU checks `gpu_report.py` does not make: the fixture models on the GPU against the CPU (float32, all layers,
the state carried over batches), float16 and bfloat16 weights against float32 (cosine per layer, words/s), and
which providers onnxruntime offers there.

    python benchmarks/gpu_checks.py --output checks.txt

Prints one line per check, `ok` or `FAILED`, and appends each to `--output` as soon as it is made.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_inference import random_model, random_sentences  # noqa: E402

from hf_elmo import ElmoConfig, ElmoModel, ElmoTokenizer  # noqa: E402
from hf_elmo.convert.from_original import convert  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
OUTPUT: Path | None = None
DEVICE = "cuda"  # --device cpu: a dry run of the script on a machine without a GPU
FAILED = []


def say(text: str, ok: bool | None = None):
    line = text if ok is None else f"{'ok    ' if ok else 'FAILED'} {text}"
    if ok is False:
        FAILED.append(text)
    print(line, flush=True)
    if OUTPUT is not None:
        with OUTPUT.open("a", encoding="utf-8") as output:
            output.write(line + "\n")


def synchronize():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def corpus_batches(batch_size: int, batches: int) -> list[list[list[str]]]:
    lines = [line.split() for line in (ROOT / "data/tinyshakespeare/input.txt").read_text().splitlines()]
    lines = [line for line in lines if line]
    return [lines[i * batch_size : (i + 1) * batch_size] for i in range(batches)]


def hidden_states(model, tokenizer, batches, device) -> list[torch.Tensor]:
    """Every batch's layers (layers, words, 2P) in float64 on the CPU, the state carried from batch to batch."""
    model = model.to(device)
    out = []
    with torch.inference_mode():
        for sentences in batches:
            encoded = tokenizer(sentences, is_split_into_words=True, padding=True, return_tensors="pt").to(device)
            states = model(**encoded, output_hidden_states=True).hidden_states
            mask = encoded["attention_mask"].bool()
            out.append(torch.stack([layer[mask] for layer in states]).double().cpu())
    return out


def fixture_models_on_the_gpu():
    """Float32 on CUDA against float32 on the CPU, the converted fixture models, 4 batches of 64 lines."""
    batches = corpus_batches(64, 4)
    for name in ("bilm-tf", "allennlp"):
        with tempfile.TemporaryDirectory() as folder:
            convert(FIXTURES / name / "options.json", FIXTURES / name / "lm_weights.hdf5", Path(folder) / "m")
            tokenizer = ElmoTokenizer.from_pretrained(Path(folder) / "m")
            cpu = hidden_states(ElmoModel.from_pretrained(Path(folder) / "m"), tokenizer, batches, "cpu")
            gpu = hidden_states(ElmoModel.from_pretrained(Path(folder) / "m"), tokenizer, batches, DEVICE)
        largest = max(float((a - b).abs().max()) for a, b in zip(cpu, gpu))
        scale = max(float(a.abs().max()) for a in cpu)
        say(
            f"{name} fixture model, float32, CUDA vs CPU: largest difference {largest:.1e} (values up to "
            f"{scale:.1f}; bound 1e-5)",
            largest <= 1e-5,
        )


def reduced_precision(batch_size: int):
    """Original size, random weights: float16 and bfloat16 weights against float32 (mean cosine per layer over the
    words of 256 sentences), and each one's words/s at `batch_size` x 20 (median of 10 after 3)."""
    config = ElmoConfig.from_preset("original")
    tokenizer = ElmoTokenizer()
    check = tokenizer(random_sentences(256, 20, seed=1), is_split_into_words=True, padding=True, return_tensors="pt")
    timed = tokenizer(random_sentences(batch_size, 20), is_split_into_words=True, padding=True, return_tensors="pt")
    check, timed = check.to(DEVICE), timed.to(DEVICE)
    layers = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        model = random_model(config, DEVICE, dtype)
        with torch.inference_mode():
            states = model(**check, output_hidden_states=True).hidden_states
            layers[dtype] = [layer.float().flatten(0, 1) for layer in states]
            for _ in range(3):
                model(**timed, output_hidden_states=True)
            times = []
            for _ in range(10):
                synchronize()
                start = time.perf_counter()
                model(**timed, output_hidden_states=True)
                synchronize()
                times.append(time.perf_counter() - start)
        seconds = sorted(times)[len(times) // 2]
        finite = all(bool(torch.isfinite(layer).all()) for layer in layers[dtype])
        cosines = [
            float(torch.nn.functional.cosine_similarity(a, b, dim=-1).mean())
            for a, b in zip(layers[dtype], layers[torch.float32])
        ]
        name = str(dtype).split(".")[1]
        say(
            f"inference {name}, original size, batch {batch_size} x 20: {batch_size * 20 / seconds:,.0f} words/s "
            f"({seconds * 1e3:.1f} ms); cosine per layer to float32 {' / '.join(f'{c:.5f}' for c in cosines)}",
            finite and min(cosines) > 0.99,
        )
        del model
        torch.cuda.empty_cache() if DEVICE == "cuda" else None


def onnxruntime_providers():
    try:
        import onnxruntime
    except ImportError as error:
        say(f"onnxruntime: not installed ({error})")
        return
    say(f"onnxruntime {onnxruntime.__version__}: providers {onnxruntime.get_available_providers()}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    global OUTPUT, DEVICE
    OUTPUT, DEVICE = args.output, args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_checks.py needs a CUDA GPU.")
    for check in (fixture_models_on_the_gpu, lambda: reduced_precision(args.batch_size), onnxruntime_providers):
        try:
            check()
        except Exception as error:  # the other checks still run
            import traceback

            traceback.print_exc()
            say(f"{getattr(check, '__name__', 'check')}: {type(error).__name__}: {error}", False)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
