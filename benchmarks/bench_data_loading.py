"""Host time to make one training batch: `load_bilm_dataset` rows through a `DataLoader` and `DataCollatorForBiLM`,
as `Trainer` reads them (shuffled, in the main process).

    python benchmarks/bench_data_loading.py --corpus data/tinyshakespeare/input.txt --batch-sizes 32 128

This work runs on the host each step (in the main process with `--dataloader-workers 0`, the default, or spread
over the workers); on a GPU it must stay below the step's GPU time, or the GPU waits for it.
"""

import argparse
import time

import torch
from bench_inference import machine_description

from hf_elmo import ElmoTokenizer
from hf_elmo.data_bilm import DataCollatorForBiLM, build_word_vocabulary, load_bilm_dataset


def batch_read_ms(dataset, batch_size: int, batches: int = 40) -> float:
    """Mean host milliseconds per shuffled, collated batch of `dataset` (after a first batch)."""
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, collate_fn=DataCollatorForBiLM(), drop_last=True
    )
    reader = iter(loader)
    next(reader)
    count = min(batches, len(loader) - 1)
    start = time.perf_counter()
    for _ in range(count):
        next(reader)
    return (time.perf_counter() - start) / count * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="data/tinyshakespeare/input.txt")
    parser.add_argument("--window", type=int, default=25)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args()
    print(machine_description("cpu"))
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(build_word_vocabulary([args.corpus], "whitespace", tokenizer, 2))
    dataset = load_bilm_dataset([args.corpus], tokenizer, args.window)
    print("| batch | ms per batch |\n| ---: | ---: |")
    for batch_size in args.batch_sizes:
        print(f"| {batch_size} | {batch_read_ms(dataset, batch_size, args.batches):.1f} |")


if __name__ == "__main__":
    main()
