"""Which computation runs each part of ELMo: one frozen description, `ElmoPaths`, and the rules that resolve "auto".

Every path computes the same function as the plain math in `modeling_elmo.py` (tested against it); they differ in
speed only. `config.paths` holds the choices (a dict in config.json, every field "auto" by default), for example
`ElmoModel.from_pretrained(folder, paths={"lstm": "reference"})`; `model.paths` shows what runs on the model's device
and dtype. `resolve` turns "auto" into a named path from the device, the dtype, training or not, and whether a graph
is being captured.
"""

import functools
from dataclasses import dataclass, field, replace

import torch

CHOICES = {
    "char_cnn": ("reference", "distinct_words", "every_word"),
    "window_max": ("torch", "compiled", "triton"),
    "highway": ("torch", "triton"),
    "lstm": ("reference", "sorted", "static"),
    "lstm_kernels": ("torch", "compiled", "triton", "triton_fused", "triton_unfused"),
    "joint_input_product": ("by_batch_size", "joint", "separate"),
    "cuda_graphs": ("on", "off"),
    "linear": ("onednn", "torch"),
    "dropout": ("compiled", "torch"),
    "threads": ("concurrent", "single"),
}
"""The named paths of each field ("auto" besides)."""

CAPTURING = (None, "cuda_graph", "export")
"""What may be capturing the model: nothing, a CUDA graph, or `torch.export` / `torch.compile`."""

# Under this many multiply-adds per row and step (5 D P: the input, state and projection products) the sorted LSTM's
# steps are many small operations whose dispatch the compiled loop saves; from it on their time goes into products
# that oneDNN forms faster than the BLAS the loop calls, and the loop is slower (the original size), except at
# inference on processors where the loop forms them itself from packed weights (`cpu_kernels.cpp`).
MAX_COMPILED_STEP_MULTIPLY_ADDS = 1 << 22

# Beyond this many positions per batch and direction a GPU stays busy with operations issued one by one, and a
# captured training step would only hold its memory twice.
MAX_CAPTURED_POSITIONS = 12_288


@dataclass(frozen=True)
class OnednnProducts:
    """The CPU matrix products `paths.linear="onednn"` sends to oneDNN: `(M, K) x (K, N)` products of at least
    `min_multiply_adds` `M K N`, and of at most `max_rows` rows `M` where given; every other product is PyTorch's."""

    min_multiply_adds: int
    max_rows: int | None = None

    def takes(self, rows: int, multiply_adds: int) -> bool:
        return multiply_adds >= self.min_multiply_adds and (self.max_rows is None or rows <= self.max_rows)

    def beside_other_threads(self) -> "OnednnProducts":
        """The products taken in a thread working beside others of the same pass (`cpu_threads.py`): a oneDNN call
        through `torch.ops` holds the GIL for as long as it runs and makes them wait, while PyTorch's products release
        it; only large products of a few rows, as the original size's per-step gate products (32 x 512 x 16384), are
        so much faster through oneDNN that this pays."""
        return OnednnProducts(min_multiply_adds=1 << 27, max_rows=64)

    def __str__(self) -> str:
        rows = "" if self.max_rows is None else f" of at most {self.max_rows} rows"
        return f"products of at least {self.min_multiply_adds:,} multiply-adds{rows}"


@functools.cache
def onednn_products() -> OnednnProducts:
    """The products oneDNN takes on this CPU. Below the threshold PyTorch's own product (MKL) is as fast or faster;
    on processors without AVX-512 both libraries run AVX2 kernels and MKL's are faster up to large products (ELMo's
    narrow per-step products, one side 64 or 128 wide, are faster through MKL on AMD Zen 3): there only the fixed
    cost of a oneDNN call is at stake above 2^23."""
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    return OnednnProducts(min_multiply_adds=1 << 20 if avx512 else 1 << 23)


@dataclass(frozen=True)
class ElmoPaths:
    """The path of each part; "auto" chooses by `resolve`'s rules. Owners: `char_cnn_fast.py` (char_cnn, window_max,
    highway), `lstm_sorted.py` (lstm "sorted"), `lstm_static.py` (lstm "static", lstm_kernels "triton*",
    joint_input_product), `cuda_graphs.py` (cuda_graphs), `onednn_linear.py` (linear), `cpu_kernels.py` (compiled
    loops, dropout), `cpu_threads.py` (threads)."""

    char_cnn: str = "auto"
    """"distinct_words": each distinct word once, windows inside a word's final run skipped; "every_word": the same
    operations whatever the input (no sort on the host)."""
    window_max: str = "auto"
    """The max over each filter's windows: PyTorch's products, the compiled CPU loop, or one Triton kernel."""
    highway: str = "auto"
    """The highway's elementwise part in PyTorch operations or one Triton kernel each way."""
    lstm: str = "auto"
    """"sorted": rows sorted by length, each step multiplying only the rows still running; "static": both directions
    stepped together over the whole batch with masks (static shapes, CUDA graphs)."""
    lstm_kernels: str = "auto"
    """The LSTM steps: PyTorch operations, the compiled CPU loop (sorted), Triton kernels (static; "triton": each
    step's product fused into its kernel where a captured layer runs faster so, "triton_fused" / "triton_unfused":
    always / never)."""
    joint_input_product: str = "auto"
    """Static path: each step multiplies its input together with its state, or all inputs in one product first."""
    cuda_graphs: str = "auto"
    """Replay the static path's layers and whole training steps as CUDA graphs (GPU tensors only)."""
    linear: str = "auto"
    """Large CPU matrix products through oneDNN, or PyTorch's."""
    dropout: str = "auto"
    """Training dropout masks from the compiled loops' counter-based generator, or PyTorch's."""
    threads: str = "auto"
    """Independent parts of a CPU inference pass side by side on threads, or one after the other."""

    # What `resolve` adds to the named paths: not choices (not in config.json), shown by `print`.
    onednn: OnednnProducts | None = field(default=None, compare=False)
    """With `linear="onednn"`, resolved: the products oneDNN takes on this CPU."""
    sampled_softmax: str | None = field(default=None, compare=False)
    """Resolved: the biLM's sampled log-sum-exp, "compiled" (the CPU loops, float32), "triton" (one fused pass each
    way, GPUs) or "torch"."""
    training_step: str | None = field(default=None, compare=False)
    """Resolved: "captured" where a biLM training step may be replayed from CUDA graphs (`cuda_graphs.py`), else
    "direct: " and the reason; per call (`ElmoForBiLM.training_step_paths`) also from the batch."""
    reasons: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """Resolved: why "auto" chose a path other than its usual one, per field (shown by `print`)."""

    def __post_init__(self):
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value != "auto" and value not in allowed:
                raise ValueError(f"paths.{name} must be one of {('auto', *allowed)}, got {value!r}.")

    @classmethod
    def reference(cls) -> "ElmoPaths":
        """The plain math everywhere: the computation every other path is tested against."""
        plain = {"char_cnn": "reference", "lstm": "reference", "joint_input_product": "separate", "cuda_graphs": "off"}
        return cls(**{**dict.fromkeys(CHOICES, "torch"), **plain, "threads": "single"})

    @classmethod
    def from_value(cls, value: "ElmoPaths | dict | None") -> "ElmoPaths":
        """`config.paths` (a dict of some fields, an `ElmoPaths` or None) -> `ElmoPaths`."""
        if value is None or isinstance(value, ElmoPaths):
            return value or cls()
        if not isinstance(value, dict):
            raise ValueError(f"paths must be a dict of {tuple(CHOICES)} or an ElmoPaths, got {value!r:.100}.")
        unknown = sorted(set(value) - set(CHOICES))
        if unknown:
            raise ValueError(f"paths has no field {unknown[0]!r}; the fields are {tuple(CHOICES)}.")
        return cls(**value)

    def to_dict(self) -> dict[str, str]:
        """The choices, as `config.paths` holds them."""
        return {name: getattr(self, name) for name in CHOICES}

    def __str__(self) -> str:
        notes = dict(self.reasons)
        if self.onednn is not None:
            notes["linear"] = str(self.onednn)
        lines = [f"{name}: {getattr(self, name)}" + (f" ({notes[name]})" if name in notes else "") for name in CHOICES]
        if self.sampled_softmax is not None:
            lines.append(f"sampled_softmax: {self.sampled_softmax}")
        if self.training_step is not None:
            lines.append(f"training_step: {self.training_step}")
        return "\n".join(lines)

    def for_training_step(
        self,
        *,
        labels: bool,
        outputs_beyond_loss: bool,
        carried: bool,
        state_takes_gradients: bool,
        gradient_checkpointing: bool,
        positions_per_direction: int,
    ) -> "ElmoPaths":
        """Resolved paths with `training_step` decided for one biLM call: captured only for a training batch with
        labels whose outputs are the loss (and, given a start state, the final state) and which is small enough
        that a GPU would wait for the host issuing its operations one by one."""
        if self.training_step != "captured":
            return self
        refusal = (
            "no labels"
            if not labels
            else "outputs beyond the loss and the final state"
            if outputs_beyond_loss
            else "a final state without a start state, or a start state without use_cache"
            if not carried
            else "a start state that takes gradients"
            if state_takes_gradients
            else "gradient checkpointing"
            if gradient_checkpointing
            else f"more than {MAX_CAPTURED_POSITIONS} positions per direction keep the GPU busy"
            if positions_per_direction > MAX_CAPTURED_POSITIONS
            else None
        )
        return self if refusal is None else replace(self, training_step=f"direct: {refusal}")


def exporting() -> bool:
    """Whether `torch.export` (also under `torch.onnx.export`) is tracing the model."""
    # Older PyTorch versions lack torch.compiler.is_exporting.
    return getattr(torch.compiler, "is_exporting", lambda: False)()


__all__ = ["CAPTURING", "CHOICES", "ElmoPaths", "OnednnProducts", "exporting", "onednn_products"]
