"""Signals during writes: SIGINT, SIGTERM and SIGHUP end a command the way Ctrl-C does, so that its cleanup runs and
nothing half-written is left; the few steps that move a complete output into place run with them held back."""

import contextlib
import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def signals_as_interrupts():
    """SIGTERM and SIGHUP raise `KeyboardInterrupt` (as SIGINT does) while the block runs; only in the main thread,
    the one Python delivers signals to."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, _raise_keyboard_interrupt) for number in STOP_SIGNALS[1:]}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def deferred_signals():
    """Holds SIGINT, SIGTERM and SIGHUP back while the block runs (a few renames that must all happen or none); one
    that arrives meanwhile takes effect when the block ends. Python runs signal handlers in the main thread between
    two bytecodes, so replacing them (not the thread's signal mask, which other threads do not share) is what holds
    them back."""
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
