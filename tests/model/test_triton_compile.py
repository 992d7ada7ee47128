"""Every Triton kernel of the package compiles for a Hopper GPU (sm_90), down to its binary, without a GPU.

The other tests run the kernels under Triton's interpreter, which executes them with NumPy and accepts what the
compiler refuses (e.g. a loop variable whose type changes between iterations); this compiles them as a GPU run
would, with the dtypes and block sizes the package launches them with."""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hf_elmo import char_cnn_triton, lstm_triton, sampled_softmax_triton
    from hf_elmo.training import adagrad

    FLOATS = {"cell_clip", "proj_clip", "lr", "eps"}

    def compile(kernel, constexprs, pointers=None, default_pointer="*bf16", num_warps=4):
        pointers = pointers or {}
        signature = {}
        for name in kernel.arg_names:
            if name in constexprs:
                signature[name] = "constexpr"
            elif name.endswith("_ptr"):
                signature[name] = pointers.get(name, default_pointer)
            else:
                signature[name] = "fp32" if name in FLOATS else "i32"
        compiled = triton.compile(
            ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": num_warps, "num_stages": 3},
        )
        assert compiled.asm.get("cubin"), kernel.__name__
        print("compiled", kernel.__name__, constexprs)
        return compiled.asm["ptx"]

    masks = {"mask_ptr": "*u8", "mask_next_ptr": "*u8", "cell_passed_ptr": "*i8", "hidden_passed_ptr": "*i8"}
    memory = {"memory_in_ptr": "*fp32", "memory_out_ptr": "*fp32", "grad_memory_ptr": "*fp32"}
    for kernel in (lstm_triton._cell_forward_kernel, lstm_triton._hidden_forward_kernel):
        compile(kernel, {"HAS_CLIP": True, "SAVE": True, "COMPUTE": triton.language.float32, "BLOCK": 512},
                {**masks, **memory})
    for kernel in (lstm_triton._cell_backward_kernel, lstm_triton._hidden_backward_kernel):
        compile(kernel, {"HAS_CLIP": True, "COMPUTE": triton.language.float32, "BLOCK": 512},
                {**masks, **memory, "grad_hidden_ptr": "*fp32"})
    compile(lstm_triton._gates_cell_forward_kernel,
            {"HAS_CLIP": True, "SAVE": True, "BLOCK_M": 128, "BLOCK_N": 32, "BLOCK_K": 64,
             "OPERANDS_IN_FLOAT32": False},
            {**masks, **memory}, num_warps=8)
    compile(sampled_softmax_triton._logsumexp_partial_kernel, {"BLOCK": 1024},
            {"skip_ptr": "*i64", "max_ptr": "*fp32", "sum_ptr": "*fp32"})
    compile(sampled_softmax_triton._logsumexp_backward_kernel, {"BLOCK": 1024},
            {"skip_ptr": "*i64", "lse_ptr": "*fp32", "grad_ptr": "*fp32"})
    compile(adagrad._adagrad_kernel, {"BLOCK": 1024}, default_pointer="*fp32")
    cnn = {"chars_ptr": "*bf16", "spans_ptr": "*i64", "argmax_ptr": "*i16", "partial_ptr": "*fp32",
           "grad_chars_ptr": "*fp32"}
    for block_n, block_k in ((128, 128), (32, 16)):  # the original model's widest and narrowest filters
        compile(char_cnn_triton._window_max_kernel,
                {"HAS_SPANS": True, "SAVE_ARGMAX": True, "BLOCK_W": 64, "BLOCK_N": block_n, "BLOCK_K": block_k,
                 "OPERANDS_IN_FLOAT32": False}, cnn, num_warps=8 if block_n == 128 else 4)
    for dtype in ("*bf16", "*fp32"):
        pointers = {**cnn, "chars_ptr": dtype}
        ptx = [
            compile(char_cnn_triton._window_max_kernel,
                    {"HAS_SPANS": True, "SAVE_ARGMAX": True, "BLOCK_W": 64, "BLOCK_N": 64, "BLOCK_K": 64,
                     "OPERANDS_IN_FLOAT32": False}, pointers, default_pointer=dtype),
            compile(char_cnn_triton._weight_grad_kernel,
                    {"HAS_SPANS": True, "BLOCK_W": 64, "BLOCK_N": 64, "BLOCK_K": 128, "OPERANDS_IN_FLOAT32": False},
                    pointers, default_pointer=dtype, num_warps=8),
            compile(char_cnn_triton._chars_grad_kernel,
                    {"HAS_SPANS": True, "WIDTH": 7, "BLOCK_W": 64, "BLOCK_N": 64, "BLOCK_E": 16,
                     "OPERANDS_IN_FLOAT32": False}, pointers, default_pointer=dtype),
        ]
        if dtype == "*fp32":  # float32 products stay float32: no TF32 tensor-core instruction
            assert all(".tf32" not in text and "fma.rn.f32" in text for text in ptx)
        else:
            assert all("bf16" in text and "mma" in text for text in ptx)
    highway = {"product_ptr": "*bf16", "x_ptr": "*fp32", "out_ptr": "*fp32", "grad_ptr": "*fp32",
               "grad_product_ptr": "*bf16", "grad_x_ptr": "*fp32"}
    compile(char_cnn_triton._highway_forward_kernel, {"COMPUTE": triton.language.float32, "BLOCK": 1024}, highway)
    compile(char_cnn_triton._highway_backward_kernel, {"COMPUTE": triton.language.float32, "BLOCK": 1024}, highway)
    """
)


def test_kernels_compile_for_hopper(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compiled from scratch, and nothing left behind
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("compiled") == 18
