"""Training throughput of the original TensorFlow code (bilm-tf) on the configuration `bench_training.py` times.

Two steps, in two environments (TensorFlow is not a dependency of this project):

    # 1. in this project's environment: the corpus as bilm-tf reads it (one sentence of space-separated words per
    #    line, split as `hf-elmo train --split pretokenizer` splits it) and the same word vocabulary
    python benchmarks/bench_bilm_tf_training.py prepare --corpus data/tinyshakespeare/input.txt --min-count 2 \\
        --output-dir bilm-tf-data
    # 2. in an environment with TensorFlow 2.x (bilm-tf runs under its `compat.v1` layer) and a checkout of
    #    https://github.com/allenai/bilm-tf (not installed: its folder is put on the path)
    python benchmarks/bench_bilm_tf_training.py run --bilm-tf ~/bilm-tf --data-dir bilm-tf-data --batches 40

`run` calls bilm-tf's own `bilm.training.train` with the options of `bench_training.py --size mid` (character CNN
of 384 filters, two highway layers, two LSTM layers of 512 cells projected to 64, dropout 0.1, 1,024 sampled
negatives, batch 32 x 20, gradient clipping 10) and times every `Session.run` of a training batch. It prints the
median, wall clock and processor time, as tokens per second per direction (batch x unroll steps, as bilm-tf
counts them). Threads: `TF_NUM_INTRAOP_THREADS` and `TF_NUM_INTEROP_THREADS`, as TensorFlow reads them.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

MID_OPTIONS = {
    "bidirectional": True,
    "char_cnn": {
        "activation": "relu",
        "embedding": {"dim": 16},
        "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 128]],
        "max_characters_per_token": 50,
        "n_characters": 261,
        "n_highway": 2,
    },
    "dropout": 0.1,
    "lstm": {
        "cell_clip": 3,
        "dim": 512,
        "n_layers": 2,
        "proj_clip": 3,
        "projection_dim": 64,
        "use_skip_connections": True,
    },
    "all_clip_norm_val": 10.0,
    "n_epochs": 1,
    "unroll_steps": 20,
    "n_negative_samples_batch": 1024,
}


def prepare(args):
    from hf_elmo import ElmoTokenizer
    from hf_elmo.training.corpus import build_word_vocabulary, iter_sentences
    from hf_elmo.word_vocabulary import write_word_vocabulary

    tokenizer = ElmoTokenizer()
    words = build_word_vocabulary([args.corpus], "pretokenizer", tokenizer, args.min_count)
    os.makedirs(args.output_dir, exist_ok=True)
    write_word_vocabulary(words, os.path.join(args.output_dir, "vocab.txt"))
    with open(os.path.join(args.output_dir, "corpus.txt"), "w", encoding="utf-8") as out:
        for sentence in iter_sentences([args.corpus], "pretokenizer", tokenizer):
            if sentence:
                out.write(" ".join(sentence) + "\n")
    print(f"{len(words):,} words in the vocabulary; corpus and vocab.txt in {args.output_dir}")


def run(args):
    import tensorflow.compat.v1 as tf

    tf.disable_v2_behavior()
    sys.modules["tensorflow"] = tf  # bilm-tf imports `tensorflow` and uses its 1.x API
    sys.path.insert(0, args.bilm_tf)
    from bilm.data import BidirectionalLMDataset
    from bilm.training import load_vocab, train

    times = []
    session_run = tf.Session.run

    def timed_run(self, fetches, *rest, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        result = session_run(self, fetches, *rest, **kwargs)
        if isinstance(fetches, list) and len(fetches) > 3:  # a training batch (the others fetch one tensor)
            times.append((time.perf_counter() - wall, time.process_time() - cpu))
        return result

    tf.Session.run = timed_run
    vocab = load_vocab(os.path.join(args.data_dir, "vocab.txt"), 50)
    options = dict(MID_OPTIONS, batch_size=args.batch_size, n_tokens_vocab=vocab.size)
    tokens_per_batch = args.batch_size * options["unroll_steps"]
    options["n_train_tokens"] = (args.batches + args.warmup) * tokens_per_batch
    data = BidirectionalLMDataset(os.path.join(args.data_dir, "corpus.txt"), vocab, test=False, shuffle_on_load=True)
    with tempfile.TemporaryDirectory() as save_dir:
        train(options, data, 1, save_dir, save_dir)
    steady = times[args.warmup :]
    wall = statistics.median(t for t, _ in steady)
    cpu = statistics.median(c for _, c in steady)
    print(
        f"bilm-tf, vocabulary {vocab.size:,}, median of {len(steady)} batches of {args.batch_size} x "
        f"{options['unroll_steps']}: {wall:.4f} s wall ({tokens_per_batch / wall:,.0f} tokens/s per direction), "
        f"{cpu:.4f} s processor time ({tokens_per_batch / cpu:,.0f}); load {os.getloadavg()[0]:.1f}"
    )
    if args.output:
        with open(args.output, "w") as out:
            json.dump(times, out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("prepare", help="write the corpus and vocabulary as bilm-tf reads them")
    make.add_argument("--corpus", required=True)
    make.add_argument("--min-count", type=int, default=2)
    make.add_argument("--output-dir", required=True)
    timing = commands.add_parser("run", help="time bilm-tf's training loop (needs TensorFlow)")
    timing.add_argument("--bilm-tf", required=True, help="a checkout of github.com/allenai/bilm-tf")
    timing.add_argument("--data-dir", required=True, help="what `prepare` wrote")
    timing.add_argument("--batch-size", type=int, default=32)
    timing.add_argument("--batches", type=int, default=40)
    timing.add_argument("--warmup", type=int, default=5)
    timing.add_argument("--output", help="write every batch's (wall, processor) seconds here as JSON")
    args = parser.parse_args()
    prepare(args) if args.command == "prepare" else run(args)


if __name__ == "__main__":
    main()
