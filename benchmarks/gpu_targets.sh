#!/usr/bin/env bash
# The suite's GPU tests, then every GPU measurement the targets need, in order of need: the report (all sections,
# cut at 5 minutes), the batch-1,024 training target, bulk embedding to HDF5 in both layouts (original size,
# bfloat16), where a batch-1,024 step's GPU time goes, and last the host's collation rate with several loader
# workers. Meant to fit in ten minutes on one H100 (the report alone took 135 s there);
# each part writes into FOLDER as it goes, so a run cut short keeps what it measured.
#
#     bash benchmarks/gpu_targets.sh FOLDER        # PYTHON=... to use another interpreter than python3
#
# `hf-elmo train`'s rows (the `Trainer` profile) need the `datasets` package.
set -u
mkdir -p "${1:?usage: bash benchmarks/gpu_targets.sh FOLDER}"
folder=$(cd "$1" && pwd)
python=${PYTHON:-python3}
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the package from this tree, installed or not
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$folder/gpu.txt" 2>&1
# The suite's GPU tests first (the kernels on CUDA tensors, CUDA graphs, the static-shape path), at most 3 minutes.
timeout 180 "$python" -m pytest -q -p no:cacheprovider tests/model/test_char_cnn_triton.py tests/model/test_cuda_graphs.py \
    tests/model/test_lstm_static.py tests/training/test_adagrad.py tests/model/test_sampled_softmax.py \
    tests/training/test_training_data.py::test_compact_windows_give_the_batches_and_the_loss_of_full_rows > "$folder/tests.txt" 2>&1
"$python" benchmarks/gpu_report.py --minutes 5 --output "$folder/report.txt" > "$folder/report.log" 2>&1
"$python" benchmarks/gpu_report.py --sections training --batches 1024 --paths static --minutes 1 \
    --output "$folder/training-1024.txt" > "$folder/training-1024.log" 2>&1
cat data/tinyshakespeare/input.txt data/tinyshakespeare/input.txt | awk '{print NR, $0}' > "$folder/lines.txt"
"$python" benchmarks/bench_embed_output.py --model original --device cuda --dtype bfloat16 --input "$folder/lines.txt" \
    --batch-size 2048 --rounds 2 > "$folder/embed.txt" 2>&1
rm -f "$folder/lines.txt"
# Diagnostic, last: where a batch-1,024 step's GPU time goes.
"$python" benchmarks/gpu_report.py --sections profile --profile-batches 1024 --paths static --minutes 1 \
    --output "$folder/profile-1024.txt" > "$folder/profile-1024.log" 2>&1
# The host side on a machine with the cores of a GPU host: collation with 0 to 8 loader workers (about a minute).
timeout 120 "$python" benchmarks/bench_data_preparation.py --words 1000000 --workers 0 2 4 8 > "$folder/data.txt" 2>&1
tail -n 5 "$folder"/*.txt
