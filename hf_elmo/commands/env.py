"""`hf-elmo env`: what this installation runs on, for bug reports and for choosing paths: the versions, the CPU
features the compiled loops and oneDNN use, whether the compiled CPU loops are built, the CUDA device, and the
computation each part of the model takes there (`--model`: with that model's configured paths)."""

import importlib.metadata
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import __version__, cpu_kernels, triton_support
from ..compute_paths import ElmoPaths
from ..configuration_elmo import ElmoConfig
from ..input_checks import device_option
from ..io.files import ElmoInputError
from ..paths_resolution import resolve
from .command_line import option

CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
"""The processor features that decide which CPU code is fast: AVX2 / AVX-512 for the compiled loops (built with
`-march=native`), AVX-512 bfloat16 and AMX for oneDNN's bfloat16 products."""

DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64")


@dataclass(kw_only=True)
class EnvOptions:
    model: str | None = option(None, help="a model folder: show the paths its config.json chooses")
    device: str | None = option(None, help="torch device to resolve the paths for (default: cuda if available)")
    dtype: str = option("float32", help="dtype to resolve the paths for", choices=DTYPE_NAMES)


COMMAND_OPTIONS = EnvOptions


def cpu_flags(cpuinfo: str | None = None) -> dict[str, bool]:
    """Which of `CPU_FLAGS` the processor has, from `/proc/cpuinfo` (`cpuinfo`: its text); empty where the system
    does not say (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return {}
    line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), None)
    if line is None:
        return {}
    present = set(line.partition(":")[2].split())
    return {flag: flag in present for flag in CPU_FLAGS}


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _config(folder: str) -> ElmoConfig:
    if not (Path(folder) / "config.json").is_file():
        raise ElmoInputError(
            f"{folder}: no config.json (expected a folder written by hf-elmo convert or save_pretrained)"
        )
    try:
        return ElmoConfig.from_pretrained(folder)
    except Exception as error:  # transformers and json each raise their own kinds
        message = " ".join(str(error).split()) or type(error).__name__
        raise ElmoInputError(f"{folder}: cannot read the configuration ({message})") from None


def report(options) -> list[str]:
    """The lines `hf-elmo env` prints."""
    device = device_option(options.device)
    config = _config(options.model) if options.model is not None else None
    flags = " ".join(f"{flag}={'yes' if has else 'no'}" for flag, has in cpu_flags().items()) or "unknown"
    triton = triton_support.triton
    rows = [
        ("hf_elmo", __version__),
        ("torch", torch.__version__),
        ("transformers", _version("transformers")),
        ("triton", triton.__version__ if triton is not None else "not installed"),
        ("python", f"{platform.python_version()} ({platform.machine()})"),
        ("cpu flags", flags),
        ("cpu loops", "compiled" if cpu_kernels.available(torch.empty(0)) else "not available (PyTorch operations)"),
    ]
    if torch.cuda.is_available():
        index = device.index if device.type == "cuda" and device.index is not None else torch.cuda.current_device()
        capability = ".".join(map(str, torch.cuda.get_device_capability(index)))
        name = torch.cuda.get_device_name(index)
        rows.append(("cuda", f"{torch.version.cuda}, cuda:{index} {name} (compute capability {capability})"))
    else:
        rows.append(("cuda", "not available"))
    lines = [f"{label:<14}{value}" for label, value in rows]
    chosen = ElmoPaths.from_value(getattr(config, "paths", None))
    dtype = getattr(torch, options.dtype)
    where = f" of {options.model}" if options.model is not None else ""
    for training in (False, True):
        lines.append(f"paths{where} on {device}, {options.dtype}, {'training' if training else 'inference'}:")
        resolved = resolve(chosen, device, dtype, training)
        lines.extend(f"  {line}" for line in str(resolved).splitlines())
    return lines


def run(options) -> int:
    """`options`: the fields of `EnvOptions`, as parsed."""
    print("\n".join(report(options)))
    return 0
