"""Reading the files the commands are given and writing their outputs so that nothing is left half-written.

Every problem with an input (a missing file, bad JSON, a field of the wrong type, an output that would replace
user data) is an `ElmoInputError`: a `ValueError` whose message is one line naming the file and what is wrong.
`hf_elmo.cli.main` prints it as `error: ...`.
"""

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


class ElmoInputError(ValueError):
    """A problem with a command's input or output; the message is one line naming the file and the field."""


ElmoConversionError = ElmoInputError  # the earlier name, raised by the converters


def read_utf8(path: str | os.PathLike, what: str) -> str:
    """The text of a UTF-8 file, with a one-line error naming the file (`what` it is) if it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ElmoInputError(f"{path}: no such {what}") from None
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


def checked_filters(filters, path: str, source: str) -> list:
    """`filters` if it is a non-empty list of `[width, number]` pairs of positive ints, else a one-line error."""
    if not isinstance(filters, list) or not filters or not all(
        isinstance(f, list) and len(f) == 2 and all(type(v) is int and v > 0 for v in f) for f in filters
    ):
        raise ElmoInputError(f"{source}: {path} must be a list of [width, number] pairs, got {filters!r}")
    return filters


def checked_config(config_class, source: str, **values):
    """`config_class(**values)`, its validator's complaint made a one-line `ElmoInputError` naming `source`."""
    try:
        return config_class(**values)
    except Exception as error:
        message = str(error).strip().splitlines()[-1].strip()
        raise ElmoInputError(f"{source}: {message}") from None


def check_output(path, force: bool = False, folder: bool = True) -> Path:
    """Refuses an output that would replace user data: a non-empty folder / an existing file, unless `force`."""
    path = Path(path)
    if folder and path.exists() and not path.is_dir():
        raise ElmoInputError(f"{path}: exists and is not a folder")
    if folder and path.is_dir() and any(path.iterdir()) and not force:
        raise ElmoInputError(f"{path}: folder is not empty (use --force to replace it)")
    if not folder and path.is_dir():
        raise ElmoInputError(f"{path}: is a folder, expected a file name")
    if not folder and path.exists() and not force:
        raise ElmoInputError(f"{path}: file exists (use --force to replace it)")
    return path


def save_atomically(output_path, write: Callable[[Path], object], force: bool = False, folder: bool = True) -> Path:
    """Calls `write(tmp)` on a fresh folder beside `output_path`, then renames it to `output_path`.

    With `folder=False`, `tmp` is a file name inside that fresh folder and the file is what gets renamed. A failure
    or an interruption leaves `output_path` as it was (a kill -9 can leave the hidden `.NAME.tmp-*` folder); an
    existing non-empty folder / existing file is refused unless `force`.
    """
    output_path = check_output(output_path, force, folder)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{output_path.name}.tmp-", dir=output_path.parent))
    try:
        if not folder:
            write(tmp_dir / output_path.name)
            if force:
                os.replace(tmp_dir / output_path.name, output_path)
            else:  # a link, unlike a rename, fails if another process created the file meanwhile
                try:
                    os.link(tmp_dir / output_path.name, output_path)
                except FileExistsError:
                    raise ElmoInputError(f"{output_path}: file exists (use --force to replace it)") from None
        else:
            write(tmp_dir)
            if output_path.exists():
                old = output_path.with_name(f".{output_path.name}.old-{os.getpid()}")
                output_path.rename(old)
                tmp_dir.rename(output_path)
                shutil.rmtree(old)
            else:
                tmp_dir.rename(output_path)
    finally:
        if tmp_dir.exists():
            shutil.rmtree(tmp_dir, ignore_errors=True)
    return output_path


def write_atomically(path: str | os.PathLike, text: str) -> str:
    """Writes a UTF-8 text file under a temporary name beside `path`, then renames it over `path`."""
    save_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), force=True, folder=False)
    return os.fspath(path)


__all__ = [
    "ElmoInputError",
    "check_output",
    "checked_config",
    "checked_filters",
    "json_field",
    "read_json_object",
    "read_utf8",
    "save_atomically",
    "write_atomically",
]
