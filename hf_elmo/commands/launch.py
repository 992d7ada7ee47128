"""The processes of a launch (`torchrun`, `accelerate launch`, or the variables set by hand): the launcher's variables
checked before any work (`Launch.from_environment`), the processes joined within a bounded time (`join`), and every
wait on the others done in the main thread in short polls, so that SIGINT and SIGTERM stop it at once (the C++ waits
of `torch.distributed` hold signals back until they return).

A launch's variables: `WORLD_SIZE` (the number of processes, default 1), `RANK` (this process, 0 to WORLD_SIZE - 1),
`LOCAL_RANK` (this process on its machine), and, for more than one process, `MASTER_ADDR` and `MASTER_PORT` (where
the processes meet: the store of the process with rank 0, or of torchrun's agent).
"""

import contextlib
import datetime
import math
import os
import re
import threading
import time
from dataclasses import dataclass

from ..io.files import ElmoInputError

POLL_SECONDS = 0.2
DEFAULT_RENDEZVOUS_TIMEOUT = 300.0
RENDEZVOUS_HELP = (
    "seconds the processes of a launch (torchrun, accelerate launch) wait for each other to join, and for a process "
    "that stops giving signs of life"
)


class LaunchError(ConnectionError):
    """Another process of the launch did not join, stopped, or cannot be reached: one line naming it."""


def _whole_number(environ, name: str, default: int | None, lowest: int) -> int | None:
    text = environ.get(name)
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        value = None
    if value is None or value < lowest:
        raise ElmoInputError(f"{name}={text!r}: expected a whole number >= {lowest} (set by the launcher)")
    return value


@dataclass(frozen=True)
class Launch:
    """This process's place in its launch: `rank` of `world_size` processes, `local_rank` on its machine."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None

    @classmethod
    def from_environment(cls, environ=None) -> "Launch":
        """The launch the variables describe, each checked: one line naming the first wrong one."""
        environ = os.environ if environ is None else environ
        world_size = _whole_number(environ, "WORLD_SIZE", 1, 1)
        rank = _whole_number(environ, "RANK", None, 0)
        if rank is None:
            if world_size > 1:
                raise ElmoInputError(f"RANK is not set: WORLD_SIZE={world_size} needs each process's rank")
            rank = 0
        if rank >= world_size:
            raise ElmoInputError(f"RANK={rank}: expected 0 to WORLD_SIZE - 1 = {world_size - 1}")
        local_rank = _whole_number(environ, "LOCAL_RANK", 0, 0)
        local_world_size = _whole_number(environ, "LOCAL_WORLD_SIZE", None, 1)
        if local_rank > rank or (local_world_size is not None and local_rank >= local_world_size):
            bound = rank if local_world_size is None else min(rank, local_world_size - 1)
            raise ElmoInputError(f"LOCAL_RANK={local_rank}: expected 0 to {bound} (RANK={rank})")
        if world_size == 1:
            return cls(rank, world_size, local_rank)
        address = environ.get("MASTER_ADDR", "").strip()
        if not address or any(c.isspace() for c in address):
            raise ElmoInputError(
                f"MASTER_ADDR={environ.get('MASTER_ADDR')!r}: expected the host of the process with rank 0 "
                f"(WORLD_SIZE={world_size})"
            )
        if "MASTER_PORT" not in environ:
            raise ElmoInputError(f"MASTER_PORT is not set: WORLD_SIZE={world_size} needs the port to meet at")
        port = _whole_number(environ, "MASTER_PORT", None, 1)
        if port > 65535:
            raise ElmoInputError(f"MASTER_PORT={port}: expected a port, 1 to 65535")
        return cls(rank, world_size, local_rank, address, port)


def check_one_process(command: str, environ=None):
    """Refuses a launch of several processes for a command that computes in one process, before any work: each
    process would repeat the work, and all but the first would find their output already written."""
    environ = os.environ if environ is None else environ
    world_size = _whole_number(environ, "WORLD_SIZE", 1, 1)
    if world_size > 1:
        raise ElmoInputError(
            f"hf-elmo {command} runs in one process; WORLD_SIZE={world_size} says this is one of {world_size} (run it "
            "without a launcher)"
        )


def check_timeout(seconds: float, name: str = "rendezvous_timeout") -> float:
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{name} must be a number of seconds > 0, got {seconds!r}.")
    return float(seconds)


def wait_in_main_thread(work, seconds: float | None, what: str):
    """Runs `work()` on a thread of its own and waits for it in short polls (a signal stops the wait); returns its
    result or raises its error; a `LaunchError` naming `what` after `seconds` (None: no limit)."""
    outcome = {}

    def run():
        try:
            outcome["result"] = work()
        except BaseException as error:  # handed to the main thread
            outcome["error"] = error

    thread = threading.Thread(target=run, name=f"hf-elmo {what}", daemon=True)
    thread.start()
    deadline = None if seconds is None else time.monotonic() + seconds
    while thread.is_alive():
        thread.join(POLL_SECONDS)
        if deadline is not None and time.monotonic() > deadline and thread.is_alive():
            raise LaunchError(f"{what}: no answer within {seconds:g} s (--rendezvous-timeout)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300] or type(error).__name__


class Rendezvous:
    """The processes of `launch` joined through the launch's store (`torch.distributed.rendezvous("env://")`):
    `store`, a key-value store they share. `stop(reason)` tells the others this process stops; `wait_for(key)` waits
    for a key while the process that sets it gives signs of life (a count each process raises every few seconds on a
    thread of its own, unless `heartbeat` is False)."""

    def __init__(self, launch: Launch, timeout: float, prefix: str, heartbeat: bool = True):
        import torch.distributed as distributed

        self.launch, self.timeout = launch, timeout

        def connect():
            delta = datetime.timedelta(seconds=timeout)
            store, _, _ = next(distributed.rendezvous("env://", launch.rank, launch.world_size, timeout=delta))
            store.set_timeout(delta)
            store = distributed.PrefixStore(prefix, store)
            store.set(f"joined/{launch.rank}", "1")
            store.wait([f"joined/{k}" for k in range(launch.world_size)])
            return store

        where = f"{launch.master_addr}:{launch.master_port}"
        try:
            self.store = wait_in_main_thread(connect, timeout + 5, f"the {launch.world_size} processes at {where}")
        except LaunchError:
            raise
        except Exception as error:  # the store's timeout or connection errors
            raise LaunchError(
                f"process {launch.rank} of {launch.world_size}: the others did not join at {where} within "
                f"{timeout:g} s (--rendezvous-timeout; {_one_line(error)})"
            ) from None
        self._beats = self._beating() if heartbeat else threading.Event()

    def _beating(self) -> threading.Event:
        """Starts raising this process's count every few seconds on a thread of its own, until the event is set."""
        stop = threading.Event()

        def beat():
            while not stop.wait(min(5.0, self.timeout / 4)):
                try:
                    self.store.add(f"beat/{self.launch.rank}", 1)
                except Exception:  # the store is gone: the waits report it
                    return

        threading.Thread(target=beat, name="hf-elmo heartbeat", daemon=True).start()
        return stop

    def stop(self, reason: str):
        """Tells the other processes that this one stops (best effort: the store may be gone)."""
        self._beats.set()
        try:
            self.store.set(f"stopped/{self.launch.rank}", reason)
        except Exception:
            pass

    def check_stopped(self, what: str):
        """A `LaunchError` naming the first other process that told it stops, and why."""
        for k in range(self.launch.world_size):
            if k != self.launch.rank and self.store.check([f"stopped/{k}"]):
                reason = self.store.get(f"stopped/{k}").decode()
                raise LaunchError(f"process {k} of {self.launch.world_size} stopped ({reason}): {what}")

    @contextlib.contextmanager
    def machine_first(self, key: str, what: str):
        """The block run first by the first process of each machine (`LOCAL_RANK` 0), which gives signs of life
        meanwhile and then sets `key/<rank>`, and after it by the machine's other processes, which wait for that in
        `wait_for`: `TrainingArguments.main_process_first` with waits that a signal, a stopped or a silent first
        process end in one line, where the barriers of `torch.distributed` hold signals back until they return."""
        first = self.launch.rank - self.launch.local_rank  # launchers number a machine's processes in a row
        if self.launch.rank != first:
            self.wait_for(key, [first], what)
            yield
            return
        beats = self._beating()
        try:
            yield
        finally:
            beats.set()
        self.check_stopped(what)  # a process that stopped while this one worked would leave it waiting later
        self.store.set(f"{key}/{self.launch.rank}", "1")

    def wait_for(self, key: str, setters: list[int], what: str):
        """Waits until every process of `setters` has set `key/<rank>`, with no time limit while they give signs of
        life; a `LaunchError` when one stops, or gives none for the rendezvous timeout."""
        last_beat = {k: (None, time.monotonic()) for k in setters}
        pending = list(setters)
        try:
            while True:
                pending = [k for k in pending if not self.store.check([f"{key}/{k}"])]
                if not pending:
                    return
                self.check_stopped(what)
                now = time.monotonic()
                for k in pending:
                    beats = self.store.add(f"beat/{k}", 0)
                    if beats != last_beat[k][0]:
                        last_beat[k] = (beats, now)
                    elif now - last_beat[k][1] > self.timeout:
                        raise LaunchError(
                            f"process {k} of {self.launch.world_size} gave no sign of life for {self.timeout:g} s "
                            f"(--rendezvous-timeout): {what}"
                        )
                time.sleep(POLL_SECONDS)
        except LaunchError:
            raise
        except Exception as error:  # the store's host is gone
            raise LaunchError(f"lost the launch's store at {self.launch.master_addr}: {_one_line(error)}") from None


def stop_reason(error: BaseException) -> str:
    """Why a process stops, as `Rendezvous.stop` tells the others: the signal, or the error's line."""
    if isinstance(error, KeyboardInterrupt):
        return f"interrupted by {error.args[0] if error.args else 'SIGINT'}"
    return _one_line(error)


def lost_process_error(error: RuntimeError) -> "LaunchError | None":
    """A collective operation's failure because another process of the launch is gone, as one line (the
    transport's own message: `Connection closed by peer [host]:port`, ...); None for any other error."""
    import torch.distributed as distributed

    if not distributed.is_initialized():
        return None
    message = _one_line(error)
    transport = re.match(r"\[[^\]]*(gloo|nccl|c10d)[^\]]*\] (.*)", message, re.IGNORECASE)
    if transport is None and not isinstance(error, distributed.DistError):
        return None
    cause = transport.group(2).split(". ")[0] if transport else message
    return LaunchError(
        f"process {distributed.get_rank()} of {distributed.get_world_size()}: another process of the launch stopped "
        f"or cannot be reached ({cause})"
    )


def init_process_group(launch: Launch, backend: str, rendezvous_timeout: float, timeout: float):
    """`torch.distributed.init_process_group` for `launch`, the joining bounded by `rendezvous_timeout` and
    interruptible; `timeout`, the collectives' own (`Trainer`'s `--ddp_timeout`). Returns the `Rendezvous` the
    processes joined through (without heartbeat: the collectives report a lost process themselves); None for one
    process or a process group already set up."""
    import torch.distributed as distributed

    if launch.world_size == 1 or distributed.is_initialized():
        return None
    rendezvous = Rendezvous(launch, rendezvous_timeout, "hf_elmo_join", heartbeat=False)

    def initialize():
        distributed.init_process_group(
            backend,
            store=distributed.PrefixStore("default_pg", rendezvous.store),
            rank=launch.rank,
            world_size=launch.world_size,
            timeout=datetime.timedelta(seconds=timeout),
        )

    wait_in_main_thread(initialize, rendezvous_timeout + 5, f"the process group of {launch.world_size} processes")
    return rendezvous
