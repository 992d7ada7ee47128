"""What every command shares: its options declared as a dataclass (`option`, `ExclusiveOptions`), the parser that
reads them (`CommandParser`, `DefaultsHelpFormatter`), and SIGTERM / SIGHUP stopping a command as Ctrl-C does
(`signals_as_interrupts`)."""

import argparse
import contextlib
import copy
import dataclasses
import signal
import threading
import types

from transformers import HfArgumentParser

from ..io.files import STOP_SIGNALS


@dataclasses.dataclass(frozen=True, eq=False)
class ExclusiveOptions:
    """Options of which at most one may be given (`required`: exactly one): the fields whose `option(...,
    exclusive=...)` is the same object (two groups are two objects, whatever their fields)."""

    required: bool = False


def option(default=dataclasses.MISSING, help: str = "", **argparse_options):
    """A field of a command's options dataclass with its help: `HfArgumentParser` makes `--name` of each field, with
    the field's type and default. Beyond argparse's own keywords (`choices`, `metavar`, ...), `positional=True`
    makes an argument without a name, `flag=True` an option taking no value (`--force`; argparse's `store_true`, so
    that a positional argument after it is not taken for its value) and `exclusive` puts it in an
    `ExclusiveOptions` group."""
    metadata = {"help": help, **argparse_options}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


class CommandParser(HfArgumentParser):
    """`HfArgumentParser` with the `positional`, `flag` and `exclusive` field options of `option`. The fields a
    dataclass inherits from another package's (`train`'s from transformers' `TrainingArguments`) are listed by
    `--help` after this package's, in a group of their own."""

    def _add_dataclass_arguments(self, dtype):
        package = dtype.__module__.split(".")[0]
        self._inherited, self._inherited_group = {}, None
        for base in reversed(dtype.__mro__[1:]):
            if dataclasses.is_dataclass(base) and base.__module__.split(".")[0] != package:
                self._inherited.update({field.name: base for field in dataclasses.fields(base)})
        super()._add_dataclass_arguments(dtype)

    def _parse_dataclass_field(self, parser: argparse.ArgumentParser, field: dataclasses.Field):
        base = getattr(self, "_inherited", {}).get(field.name)
        if base is not None:
            if self._inherited_group is None:
                title = f"{base.__name__} of {base.__module__.split('.')[0]} (general training options)"
                self._inherited_group = self.add_argument_group(title)
            parser = self._inherited_group
        metadata = dict(field.metadata)
        exclusive = metadata.pop("exclusive", None)
        if exclusive is not None:
            groups = self.__dict__.setdefault("_exclusive_groups", {})
            if exclusive not in groups:
                groups[exclusive] = parser.add_mutually_exclusive_group(required=exclusive.required)
            parser = groups[exclusive]
        if metadata.pop("positional", False):
            of_list = getattr(field.type, "__origin__", None) is list
            item_type = field.type.__args__[0] if of_list else field.type
            parser.add_argument(field.name, type=item_type, nargs="+" if of_list else None, **metadata)
            return
        if metadata.pop("flag", False):
            names = dict.fromkeys([f"--{field.name}", f"--{field.name.replace('_', '-')}"])
            parser.add_argument(*names, action="store_true", **metadata)
            return
        field = copy.copy(field)
        field.metadata = types.MappingProxyType(metadata)
        super()._parse_dataclass_field(parser, field)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds an option's default to its help where there is one to say (not `None`, not an unset flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def signals_as_interrupts():
    """SIGTERM and SIGHUP raise `KeyboardInterrupt` (as SIGINT does) while the block runs, so that the cleanup of
    whatever is being written runs; only in the main thread, the one Python delivers signals to."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, _raise_keyboard_interrupt) for number in STOP_SIGNALS[1:]}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
