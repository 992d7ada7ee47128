"""Reading the files the commands are given, and writing their outputs by one rule, so that nothing is lost or left
half-written.

Every problem with an input (a missing file, bad JSON, a field of the wrong type, an output that would replace
user data) is an `ElmoInputError`: a `ValueError` whose message is one line naming the file and what is wrong.
The command line (`hf_elmo.commands.cli`) prints it as `error: ...`.

The output rule (`check_output`, `write_output`), the same for every command that writes:

* An output that is, holds or lies inside one of the command's inputs is refused, as is a symbolic link, a folder
  that is (or holds) the working folder, and anything that is not a regular file where a file is to be written.
* An existing output is replaced only with `--force`, and only if it is an earlier output of the same kind (an HDF5
  file for `embed`, a model folder for `convert`, ...): a folder holding anything else (notes, subfolders) is refused.
* The output is written beside its final place under a hidden temporary name and renamed when complete; the renames
  run with SIGINT, SIGTERM and SIGHUP held back (`deferred_signals`), and those signals otherwise end a command the
  way Ctrl-C does (`commands.command_line.signals_as_interrupts`, around every command), so that its cleanup runs:
  only a kill -9 can leave a hidden `.NAME.tmp-*` or `.NAME.old-*` behind.
"""

import codecs
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..folder_files import (
    ElmoInputError,
    follow_umask,
    json_field,
    read_json_object,
    read_utf8,
    replace_atomically,
    write_atomically,
)

ElmoConversionError = ElmoInputError  # the earlier name, raised by the converters


def read_lines(path) -> Iterator[str]:
    """The lines of a UTF-8 file (`-`: standard input) without their line ends: the one reader of every command's
    text. `\n`, `\r\n` and `\r` all end a line, as in Python's text mode, and a byte-order mark at the start is not
    part of the first line. Invalid UTF-8 is an `ElmoInputError` naming the line."""
    stream = sys.stdin.buffer if str(path) == "-" else None
    if stream is None:
        try:
            stream = open(path, "rb")
        except OSError as error:
            raise ElmoInputError(f"{path}: cannot read input ({error.strerror})") from None
    number = 0
    with stream:
        for chunk in stream:  # split at b"\n" only; splitlines splits at \n, \r\n and \r (bytes: nothing else)
            if number == 0:
                chunk = chunk.removeprefix(codecs.BOM_UTF8)
            for piece in chunk.splitlines():
                number += 1
                try:
                    yield piece.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise ElmoInputError(
                        f"{path}: line {number} is not valid UTF-8 (byte {error.start + 1}: {error.reason})"
                    ) from None


def checked_filters(filters, path: str, source: str) -> list:
    """`filters` if it is a non-empty list of `[width, number]` pairs of positive ints, else a one-line error."""
    if (
        not isinstance(filters, list)
        or not filters
        or not all(isinstance(f, list) and len(f) == 2 and all(type(v) is int and v > 0 for v in f) for f in filters)
    ):
        raise ElmoInputError(f"{source}: {path} must be a list of [width, number] pairs, got {filters!r}")
    return filters


def checked_config(config_class, source: str, **values):
    """`config_class(**values)`, its validator's complaint made a one-line `ElmoInputError` naming `source`."""
    try:
        return config_class(**values)
    except Exception as error:
        message = str(error.__cause__ or error).strip().splitlines()[-1].strip()  # the validator's own error
        raise ElmoInputError(f"{source}: {message}") from None


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


CARD_MARKER = "<!-- Written by hf-elmo's save_pretrained, which rewrites it: delete this line to keep your edits. -->"
"""The first line of the model card `save_pretrained` wrote (`hub_elmo`), and so may write again; a README.md without it
is someone else's."""


@dataclass(frozen=True)
class OutputKind:
    """What a command writes, and how an earlier output of the same command is recognised: the only thing `--force`
    replaces. `is_earlier_output` gets the existing file, or each entry of the existing folder."""

    what: str
    folder: bool
    is_earlier_output: Callable[[Path], bool]


def _is_model_folder_file(path: Path) -> bool:
    # save_pretrained copies the package's modules as remote code; the rest are transformers' and the tokenizer's.
    names = {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "model.safetensors.index.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "char_vocab.json",
        "input_word_vocab.json",
        "vocab.txt",
    }
    ours = path.name in names or re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", path.name) is not None
    ours = ours or (path.suffix == ".py" and (Path(__file__).parents[1] / path.name).is_file())
    if path.name == "README.md":  # the model card save_pretrained wrote, not one written by someone else
        try:
            return CARD_MARKER in path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return False
    if ours and path.name == "config.json":
        try:
            return json.loads(path.read_text(encoding="utf-8")).get("model_type") == "elmo"
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            return False
    return ours


def _starts_with(prefix: bytes) -> Callable[[Path], bool]:
    def check(path: Path) -> bool:
        with open(path, "rb") as f:
            return f.read(len(prefix)) == prefix

    return check


MODEL_FOLDER = OutputKind(
    "a model folder (config.json of an ELMo, weights, tokenizer, code)", True, _is_model_folder_file
)
ORIGINAL_FOLDER = OutputKind(
    "an original-format folder (options.json, weights.hdf5)", True, lambda p: p.name in ("options.json", "weights.hdf5")
)
HDF5_FILE = OutputKind("an HDF5 file", False, _starts_with(b"\x89HDF\r\n\x1a\n"))
VOCABULARY_FILE = OutputKind("a word vocabulary (<S>, </S>, <UNK> first)", False, _starts_with(b"<S>\n</S>\n<UNK>\n"))


def _is_residue_text(path: Path) -> bool:
    with open(path, "rb") as text:
        first = text.readline(1 << 20)
    return re.fullmatch(rb"[A-Z]( [A-Z])*\n", first) is not None


RESIDUE_TEXT_FILE = OutputKind(
    "protein residues as text (one protein per line, residues as words)", False, _is_residue_text
)


def check_not_an_input(path, inputs: Iterable) -> Path:
    """Refuses an output that is, holds or lies inside one of `inputs` (files or folders; `None` and `-` skipped)."""
    path = Path(path)
    resolved = Path(os.path.realpath(path))
    for given in inputs:
        if given is None or str(given) == "-" or not os.path.exists(given):
            continue
        source = Path(os.path.realpath(given))
        if resolved == source or (path.exists() and os.path.samefile(path, given)):
            raise ElmoInputError(f"{path}: is the input {given}; write the output elsewhere")
        if source.is_relative_to(resolved):
            raise ElmoInputError(f"{path}: holds the input {given}; write the output elsewhere")
        if resolved.is_relative_to(source):
            raise ElmoInputError(f"{path}: is inside the input {given}; write the output elsewhere")
    return path


def check_output(path, kind: OutputKind, inputs: Iterable = (), force: bool = False) -> Path:
    """Applies the output rule of the module docstring to `path`; returns it as a `Path`."""
    path = Path(path)
    noun = "folder" if kind.folder else "file"
    if path.is_symlink():
        raise ElmoInputError(f"{path}: is a symbolic link; give the {noun} itself or a new name")
    if kind.folder and Path.cwd().resolve().is_relative_to(path.resolve()):
        raise ElmoInputError(f"{path}: is (or holds) the current folder; name another output folder")
    check_not_an_input(path, inputs)
    if not kind.folder and path.is_dir():
        raise ElmoInputError(f"{path}: is a folder, expected a file name")
    if kind.folder and path.exists() and not path.is_dir():
        raise ElmoInputError(f"{path}: exists and is not a folder")
    if not os.path.lexists(path) or (kind.folder and not any(path.iterdir())):
        return path
    if not kind.folder and not path.is_file():
        raise ElmoInputError(f"{path}: exists and is not a regular file; name a new file")
    if not force:
        what = "folder is not empty" if kind.folder else "file exists"
        raise ElmoInputError(f"{path}: {what} (use --force to replace it)")
    if not kind.folder:
        if not kind.is_earlier_output(path):
            raise ElmoInputError(f"{path}: is not {kind.what}; --force replaces only that: name a new file")
        return path
    for entry in sorted(path.iterdir()):
        if entry.is_symlink() or not entry.is_file() or not kind.is_earlier_output(entry):
            raise ElmoInputError(
                f"{path}: holds {entry.name!r}, which is not part of {kind.what}; --force replaces only such a "
                "folder: move it away or name another folder"
            )
    return path


def _fresh_folder(parent: Path, prefix: str) -> Path:
    """A new empty folder in `parent` with the permissions any new folder gets (not tempfile's 0700)."""
    while True:
        folder = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue


def write_output(path, write: Callable[[Path], object], kind: OutputKind, inputs: Iterable = (), force: bool = False):
    """Checks `path` (`check_output`), calls `write(target)` on a fresh hidden folder beside it (`target` is that
    folder, or the file name inside it for a file output), then moves the result into place. Returns `path`."""
    inputs = list(inputs)
    path = check_output(path, kind, inputs, force)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = _fresh_folder(path.parent, f".{path.name}.tmp-")
    except OSError as error:
        raise ElmoInputError(f"{path}: cannot write there ({error.strerror or error})") from None
    try:
        target = staging if kind.folder else staging / path.name
        write(target)
        check_output(path, kind, inputs, force)  # what may have appeared there meanwhile
        with deferred_signals():
            if not kind.folder and force:
                os.replace(target, path)
            elif not kind.folder:  # a link, unlike a rename, fails if another process created the file meanwhile
                try:
                    os.link(target, path)
                except FileExistsError:
                    raise ElmoInputError(f"{path}: file exists (use --force to replace it)") from None
            elif path.exists():
                earlier = path.with_name(f".{path.name}.old-{os.getpid()}")
                path.rename(earlier)
                staging.rename(path)
                shutil.rmtree(earlier)
            else:
                staging.rename(path)
    except OSError as error:
        raise ElmoInputError(f"{path}: not written ({error.strerror or error})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


class HDF5Output:
    """An HDF5 file being written, `.file` (`h5py.File`), whose failed writes (a full disk, a file-size limit) are
    raised as `OSError` by `check()` and when the block ends.

    HDF5 does not survive a failed write: h5py then cannot release its objects (a traceback per object, printed and
    ignored, and the writing goes on) and closing the file crashes the process. So the file is written through a
    Python file object (h5py's `fileobj` driver) that keeps the first error and from then on writes nothing and
    reports success: HDF5 closes cleanly, and the caller discards the file."""

    def __init__(self, path: str | os.PathLike, append: bool = False):
        """`append`: open an existing HDF5 file to add to it, instead of writing a new one."""
        import h5py

        self.error: OSError | None = None
        self._raw = open(path, "r+b" if append else "w+b", buffering=0)
        try:
            self.file = h5py.File(_FirstErrorKept(self), "a" if append else "w")
        except BaseException:
            self._raw.close()
            raise

    def check(self):
        """Raises the first failed write's `OSError`, if there was one."""
        if self.error is not None:
            raise OSError(self.error.errno, self.error.strerror or str(self.error))

    def __enter__(self) -> "HDF5Output":
        return self

    def __exit__(self, exc_type, exc, traceback):
        try:
            self.file.close()
        finally:
            self._raw.close()
        if exc_type is None:
            self.check()


class _FirstErrorKept:
    """The file object under an `HDF5Output`: keeps its first `OSError` and writes nothing after it."""

    def __init__(self, output: HDF5Output):
        self.output, self.raw = output, output._raw

    def _attempt(self, operation, *args):
        if self.output.error is None:
            try:
                operation(*args)
            except OSError as error:
                self.output.error = error

    def _write_all(self, data):
        view = memoryview(data).cast("B")
        while view:
            view = view[self.raw.write(view) :]

    def write(self, data) -> int:
        self._attempt(self._write_all, data)
        return memoryview(data).nbytes

    def truncate(self, size: int) -> int:
        self._attempt(self.raw.truncate, size)
        return size

    def flush(self):
        pass  # unbuffered

    def read(self, size: int = -1) -> bytes:
        return self.raw.read(size)

    def readinto(self, buffer) -> int:
        return self.raw.readinto(buffer)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()


@contextlib.contextmanager
def deferred_signals():
    """Holds SIGINT, SIGTERM and SIGHUP back while the block runs (renames that must all happen or none); one that
    arrives meanwhile takes effect when the block ends. Python runs signal handlers in the main thread between two
    bytecodes, so replacing them (not the thread's signal mask, which other threads do not share) holds them back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = {number: signal.signal(number, lambda signum, frame: received.append(signum)) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if received:
            signal.raise_signal(received[0])


__all__ = [
    "HDF5_FILE",
    "HDF5Output",
    "MODEL_FOLDER",
    "ORIGINAL_FOLDER",
    "VOCABULARY_FILE",
    "ElmoInputError",
    "OutputKind",
    "check_not_an_input",
    "check_output",
    "checked_config",
    "replace_atomically",
    "checked_filters",
    "deferred_signals",
    "follow_umask",
    "json_field",
    "read_json_object",
    "read_lines",
    "read_utf8",
    "write_atomically",
    "write_output",
]
