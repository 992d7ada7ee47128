"""The files of a model folder, read and written the same way by the model, its tokenizer and the commands.

Reading a file gives one-line errors naming it (`ElmoInputError`, a `ValueError`); writing a file replaces it whole
(`replace_atomically`): a reader sees the old file or the complete new one. The model imports this module rather than
`file_io` (the commands' outputs and signal handling), so a saved model's remote code carries no command-line code.
"""

import hashlib
import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path


class ElmoInputError(ValueError):
    """A problem with an input file (or a command's output); the message is one line naming the file and the field."""


def read_utf8(path: str | os.PathLike, what: str) -> str:
    """The text of a UTF-8 file, with a one-line error naming the file (`what` it is) if it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ElmoInputError(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise ElmoInputError(f"{path}: is a folder, expected the {what}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ElmoInputError(f"{path}: cannot read {what} ({error})") from None


def read_json_object(path: str | os.PathLike, what: str) -> dict:
    """Reads a JSON object, with one-line errors naming the file (`what` it is) for a missing file or bad JSON."""
    text = read_utf8(path, what)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        where = f"line {error.lineno}, column {error.colno}"
        raise ElmoInputError(f"{path}: not valid JSON ({where}: {error.msg})") from None
    if not isinstance(value, dict):
        raise ElmoInputError(f"{path}: expected a JSON object ({what}), got {type(value).__name__}")
    return value


def json_field(options: dict, path: str, source: str, default=KeyError):
    """`options["a"]["b"]` for the `path` `"a.b"`; `default` if given and missing, else a one-line error."""
    value = options
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            if default is not KeyError:
                return default
            raise ElmoInputError(f"{source}: missing field '{path}'")
        value = value[key]
    return value


def _umask() -> int:
    try:  # Linux says it without changing it, which os.umask does for every thread
        with open("/proc/self/status", encoding="ascii") as status:
            return next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def follow_umask(path: str | os.PathLike):
    """Gives the file `path` the permissions any new file gets (0666 less the umask): safetensors creates its files
    0600, unlike every other output."""
    os.chmod(path, 0o666 & ~_umask())


def replace_atomically(path: str | os.PathLike, write: Callable[[Path], object]) -> str:
    """`write(temporary)` on a temporary name beside `path`, then renames it over `path`: the file is the old one or
    the complete new one (e.g. the weights of a model folder updated in place), with the permissions of a new file.

    One rename needs no signals held back: a signal arriving during it takes effect once it is done."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        write(temporary)
        follow_umask(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return os.fspath(path)


def write_atomically(path: str | os.PathLike, text: str) -> str:
    """Writes a UTF-8 text file under a temporary name beside `path`, then renames it over `path` (a file inside a
    folder being written, such as the files of `save_pretrained`; commands' outputs go through `write_output`)."""
    return replace_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def cache_record_path(path: str | os.PathLike) -> Path:
    """The record of the cache file `path`: its length and SHA-256, beside it."""
    path = Path(path)
    return path.with_name(f"{path.name}.record.json")


def length_and_digest(path: Path) -> dict:
    """`{"bytes": ..., "sha256": ...}` of the file `path`, read in blocks."""
    digest, length = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
            length += len(block)
    return {"bytes": length, "sha256": digest.hexdigest()}


def record_cache_file(path: str | os.PathLike) -> None:
    """Writes the record of the complete cache file `path`, last: a file without a record was never finished."""
    write_atomically(cache_record_path(path), json.dumps(length_and_digest(Path(path))))


def cache_file_damage(path: str | os.PathLike) -> str | None:
    """What is wrong with the cache file `path` against its record, or None when it is whole (the data its writer
    recorded, neither cut short nor changed)."""
    record_path = cache_record_path(path)
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        expected = (int(record["bytes"]), str(record["sha256"]))
    except FileNotFoundError:
        return f"no {record_path.name} beside it (its length and digest, written after the data)"
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError) as error:
        return f"its record {record_path.name} is unreadable ({type(error).__name__})"
    try:
        found = length_and_digest(Path(path))
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    if found["bytes"] != expected[0]:
        return f"{found['bytes']:,} bytes where {record_path.name} records {expected[0]:,}"
    if found["sha256"] != expected[1]:
        return f"its SHA-256 differs from the one {record_path.name} records"
    return None


def remove_cache_file(path: str | os.PathLike) -> None:
    """Removes a cache file and its record."""
    Path(path).unlink(missing_ok=True)
    cache_record_path(path).unlink(missing_ok=True)


__all__ = [
    "ElmoInputError",
    "cache_file_damage",
    "cache_record_path",
    "follow_umask",
    "json_field",
    "read_json_object",
    "read_utf8",
    "record_cache_file",
    "remove_cache_file",
    "replace_atomically",
    "write_atomically",
]
