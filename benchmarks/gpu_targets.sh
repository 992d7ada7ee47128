#!/usr/bin/env bash
# Everything the GPU issue asks for in one run that fits a stretch of GPU time, in order of need:
#   1. a first forward pass on the GPU (the run stops here if even that fails); the suite's GPU tests beside
#      `hf-elmo train` end to end (tiny and original presets, windows and --stream, bfloat16 and float32), then
#      `hf-elmo embed --device cuda` against `--device cpu` and the fixture models on the GPU against the CPU;
#   2. the targets: training throughput (original size, batches 128 and 1,024), where a step's GPU time goes (the
#      benchmark loop and `Trainer`, with kernel tables and torch.profiler traces), inference (float32, bfloat16,
#      float16 beside them), onnxruntime's providers;
#   3. the host side: collation with 0, 2, 4 and 8 loader workers; the CPU LSTM loop's packed step products against
#      PyTorch's on the host's processor (often an Intel one, where MKL uses AVX-512).
# Each part writes into FOLDER as it goes and the folder is packed into FOLDER.tar.gz (or PACK) after each part, so a
# run cut short keeps what it measured.
#
#     bash benchmarks/gpu_targets.sh FOLDER        # PYTHON=... to use another interpreter than python3
#     ALLENNLP_CODE=CHECKOUT bash benchmarks/gpu_targets.sh FOLDER   # also proteins beside AllenNLP v0.9.0
set -u
mkdir -p "${1:?usage: bash benchmarks/gpu_targets.sh FOLDER}"
folder=$(cd "$1" && pwd)
python=${PYTHON:-python3}
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the package from this tree, installed or not
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
start=$(date +%s)
packed=${PACK:-$folder.tar.gz}
runs=$(mktemp -d)  # the trained models: too large to keep
trap 'rm -rf "$runs"' EXIT
pack() {  # $1: what just ended
    echo "[$(($(date +%s) - start)) s] $1" | tee -a "$folder/times.txt"
    tar czf "$packed.part" -C "$(dirname "$folder")" "$(basename "$folder")" && mv "$packed.part" "$packed"
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$folder/gpu.txt" 2>&1
"$python" -c "import torch, transformers, triton, datasets; print(torch.__version__, torch.version.cuda, transformers.__version__, triton.__version__, datasets.__version__)" >> "$folder/gpu.txt" 2>&1
nproc >> "$folder/gpu.txt"
# A GPU host's image may lack the project's dependencies (datasets, say): stop before any GPU time goes to a run that
# cannot train; install them (wheels built elsewhere, where the host has no index) and run again.
if ! "$python" -c "import accelerate, datasets, h5py, safetensors, tokenizers, transformers" >> "$folder/gpu.txt" 2>&1; then
    cat "$folder/gpu.txt"
    pack "dependencies missing"
    exit 1
fi
timeout 90 "$python" - > "$folder/smoke.txt" 2>&1 <<'EOF'
import torch
from hf_elmo import ElmoConfig, ElmoModel, ElmoTokenizer
model = ElmoModel(ElmoConfig.from_preset("tiny")).cuda().eval()
encoded = ElmoTokenizer()([["A", "first", "sentence", "."], ["Two", "words"]], is_split_into_words=True, padding=True, return_tensors="pt").to("cuda")
with torch.inference_mode():
    states = model(**encoded, output_hidden_states=True).hidden_states
print("layers", len(states), tuple(states[-1].shape), "finite", all(bool(torch.isfinite(s).all()) for s in states))
print(model.paths)
EOF
smoke=$?
cat "$folder/gpu.txt" "$folder/smoke.txt"
pack "smoke: exit status $smoke"
[ "$smoke" = 0 ] || exit 1

# 1. The suite's GPU tests (CUDA-only ones first), beside the command line's end-to-end runs.
( timeout 150 "$python" -m pytest -q -p no:cacheprovider -n 4 -rs tests/model/test_lstm_static.py \
    tests/model/test_cuda_graphs.py tests/model/test_char_cnn_triton.py tests/training/test_adagrad.py \
    tests/model/test_sampled_softmax.py tests/model/test_triton_compile.py tests/training/test_training_data.py \
    tests/model/test_pipelines.py tests/training/test_training.py::test_loader_defaults_follow_the_device \
    tests/training/test_training_stream.py::test_training_carries_the_state_from_batch_to_batch \
    tests/convert/test_elmoformanylangs.py::test_the_stand_in_needs_the_cpu_map_location > "$folder/tests.txt" 2>&1
  echo "exit status $?" >> "$folder/tests.txt" ) &
tests=$!
corpus=data/tinyshakespeare/input.txt
train() {  # name, timeout, options...
    local name=$1 limit=$2
    shift 2
    timeout "$limit" "$python" -m hf_elmo.commands train --train_files $corpus --output_dir "$runs/$name" \
        --logging_steps 25 --save_strategy no --disable_tqdm true --report_to none "$@" > "$folder/train-$name.txt" 2>&1
    echo "exit status $?" >> "$folder/train-$name.txt"
}
# Side by side (the GPU and the host's cores have room for all): whether they run, not how fast.
train tiny-windows-bf16 140 --config tiny --max_steps 300 --per_device_train_batch_size 64 --bf16 &
train tiny-stream-fp32 140 --config tiny --max_steps 300 --per_device_train_batch_size 64 --stream &
train original-windows-bf16 140 --config original --max_steps 200 --per_device_train_batch_size 128 --bf16 &
train original-stream-fp32 140 --config original --max_steps 100 --per_device_train_batch_size 128 --stream &
wait
pack "tests and hf-elmo train"
head -n 2000 $corpus > "$folder/lines.txt"
for device in cuda cpu; do
    timeout 45 "$python" -m hf_elmo.commands embed --model "$runs/tiny-windows-bf16" --all --device $device \
        --batch_size 256 "$folder/lines.txt" "$folder/embed-$device.h5" > "$folder/embed-$device.txt" 2>&1
    echo "exit status $?" >> "$folder/embed-$device.txt"
done
"$python" - "$folder" > "$folder/embed-compare.txt" 2>&1 <<'EOF'
import sys, h5py, numpy as np
folder = sys.argv[1]
with h5py.File(f"{folder}/embed-cuda.h5") as gpu, h5py.File(f"{folder}/embed-cpu.h5") as cpu:
    keys = [k for k in cpu if isinstance(cpu[k], h5py.Dataset) and cpu[k].dtype.kind == "f"]
    assert sorted(keys) == sorted(k for k in gpu if isinstance(gpu[k], h5py.Dataset) and gpu[k].dtype.kind == "f"), "different datasets"
    largest = max(float(np.abs(gpu[k][...].astype(np.float64) - cpu[k][...]).max(initial=0.0)) for k in keys)
    scale = max(float(np.abs(cpu[k][...]).max(initial=0.0)) for k in keys)
print(f"{'ok' if largest <= 1e-5 else 'FAILED'} embed --device cuda vs cpu: {len(keys)} datasets, largest difference {largest:.1e} (values up to {scale:.1f})")
EOF
rm -f "$folder/lines.txt" "$folder"/embed-*.h5
rm -rf "$runs"/*
timeout 80 "$python" benchmarks/gpu_checks.py --output "$folder/checks.txt" > "$folder/checks.log" 2>&1
pack "embed and checks"

# 2. The targets, one section at a time (each report cut at its minutes).
mkdir -p "$folder/traces"
timeout 110 "$python" benchmarks/gpu_report.py --sections exactness training --sizes original --batches 128 1024 \
    --paths static --minutes 1.2 --output "$folder/training.txt" > "$folder/training.log" 2>&1
pack "training"
timeout 150 "$python" benchmarks/gpu_report.py --sections profile --paths static --kernels 25 --traces "$folder/traces" \
    --minutes 1.5 --output "$folder/profile.txt" > "$folder/profile.log" 2>&1
gzip -f "$folder"/traces/*.json 2>/dev/null
pack "profile"
timeout 60 "$python" benchmarks/gpu_report.py --sections inference --quick --paths static --minutes 0.5 \
    --output "$folder/inference.txt" > "$folder/inference.log" 2>&1
pack "inference"

# Proteins on the GPU beside AllenNLP 0.9's ElmoEmbedder, where a checkout of it is given (ALLENNLP_CODE).
if [ -d "${ALLENNLP_CODE:-}" ]; then
    timeout 90 "$python" benchmarks/bench_protein.py --their-code "$ALLENNLP_CODE" --device cuda --residues 30000 \
        --rounds 2 > "$folder/proteins.txt" 2>&1
    pack "proteins"
fi

# 3. The host side with the GPU host's cores.
timeout 40 "$python" benchmarks/bench_data_preparation.py --words 1000000 --workers 0 2 4 8 > "$folder/data.txt" 2>&1
pack "data"
timeout 60 "$python" benchmarks/bench_lstm_steps.py --rows 1 4 16 64 --steps 100 --threads 1 --repeats 3 \
    > "$folder/lstm-steps.txt" 2>&1
pack "lstm-steps"
cd "$folder" && tail -n 4 tests.txt train-*.txt embed-compare.txt && cat checks.txt training.txt profile.txt inference.txt
tail -n 4 proteins.txt 2>/dev/null; cat data.txt lstm-steps.txt times.txt
