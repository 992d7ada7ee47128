"""onnxruntime against the PyTorch CPU path, with random weights: words per second (boundaries not counted).

    python benchmarks/bench_onnx.py --sizes small original --batch-size 32 --words 20 --threads 2
    python benchmarks/bench_onnx.py --sizes tiny --batch-size 2 --words 3 --repeats 1 --warmup 0   # a quick check

Each size is saved, exported by `hf-elmo export --format onnx` (`export_onnx.export_onnx`) and quantised by
onnxruntime's dynamic int8 quantisation (`quantize_dynamic`: int8 weights, activations quantised at run time). The
three paths compute all layers of the same batch, taking turns in one process (`bench_inference.time_alternating`),
so that load changes hit all of them alike. Prints the machine, words/s and seconds per batch (median of
`--repeats`), then per layer the cosine of each onnxruntime path's vectors to PyTorch's over the real positions
(mean and minimum) and their largest absolute difference.
"""

import argparse
import tempfile
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from bench_inference import machine_description, median, random_model, random_sentences, time_alternating
from onnxruntime.quantization import QuantType, quantize_dynamic

from hf_elmo import ElmoConfig, ElmoTokenizer
from hf_elmo.convert.to_onnx import export_onnx


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def layer_agreement(reference: np.ndarray, other: np.ndarray, real: np.ndarray) -> list[tuple[float, float, float]]:
    """Per layer of `(L + 1, B, T, 2P)` outputs: mean and minimum cosine over the real positions, max abs diff."""
    result = []
    for want, got in zip(reference, other):
        want, got = want[real], got[real]
        cosine = (want * got).sum(-1) / (np.linalg.norm(want, axis=-1) * np.linalg.norm(got, axis=-1))
        result.append((float(cosine.mean()), float(cosine.min()), float(np.abs(want - got).max())))
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sizes = ["tiny", "small", "medium", "original"]
    parser.add_argument("--sizes", nargs="+", default=["small", "original"], choices=sizes)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--words", type=int, default=20, help="words per sentence")
    parser.add_argument("--threads", type=int, default=2, help="PyTorch's and onnxruntime's intra-op threads")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    print(f"machine: {machine_description('cpu')}, onnxruntime {ort.__version__}")
    print(
        f"{args.words} words per sentence, batch {args.batch_size}, median of {args.repeats} after {args.warmup} "
        "warm-up"
    )
    print(f"{'size':<10}{'path':<18}{'words/s':>10}{'s/batch':>10}")
    tokenizer = ElmoTokenizer()
    sentences = random_sentences(args.batch_size, args.words)
    batch = tokenizer(sentences, is_split_into_words=True, padding=True, return_tensors="pt")
    batch = {name: batch[name] for name in ("input_ids", "attention_mask")}
    feed = {name: tensor.numpy() for name, tensor in batch.items()}
    real = feed["attention_mask"].astype(bool)
    for size in args.sizes:
        model = random_model(ElmoConfig.from_preset(size), "cpu", torch.float32)
        with tempfile.TemporaryDirectory() as folder:
            folder = Path(folder)
            model.save_pretrained(folder / "model")
            export_onnx(folder / "model", folder / "onnx")
            quantize_dynamic(folder / "onnx/model.onnx", folder / "model.int8.onnx", weight_type=QuantType.QInt8)
            sessions = {
                "onnxruntime": session(folder / "onnx/model.onnx", args.threads),
                "onnxruntime int8": session(folder / "model.int8.onnx", args.threads),
            }

        def pytorch(model=model, batch=batch):
            with torch.inference_mode():
                return model(**batch, output_hidden_states=True).hidden_states

        calls = {"pytorch": pytorch}
        calls.update({name: partial(run.run, ["hidden_states"], feed) for name, run in sessions.items()})
        times = time_alternating(calls, args.repeats, args.warmup, "cpu")
        for name, seconds in times.items():
            words_per_second = args.batch_size * args.words / median(seconds)
            print(f"{size:<10}{name:<18}{words_per_second:>10,.0f}{median(seconds):>10.3f}")
        expected = torch.stack(pytorch()).numpy()
        for name, run in sessions.items():
            (layers,) = run.run(["hidden_states"], feed)
            for layer, (mean, low, diff) in enumerate(layer_agreement(expected, layers, real)):
                print(
                    f"{'':<10}{name}, layer {layer}: cosine to PyTorch mean {mean:.5f}, min {low:.5f}, "
                    f"max abs diff {diff:.3g}"
                )


if __name__ == "__main__":
    main()
