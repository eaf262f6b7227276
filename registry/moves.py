"""Moving the production pointer for ``han-model promote`` and ``rollback``, and waiting for the services.

A move is all or nothing: the pointer goes back where it was when a running service cannot load the
version, and when the command is interrupted (Ctrl-C, or SIGTERM from a supervisor) before every
service serves it, since nothing checked the version then (a killed promote once left production on a
version no service could load, and a restarted service failed to start). ``decisions.jsonl`` gets
"promoted" only once the move is done; an attempt that did not move production says so instead.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from model_store import load_checked
from model_store.production import (
    PromotionError,
    live_replicas,
    pointer_stamp,
    read_pointer,
    record_decision,
    restore_pointer,
    set_pointer,
)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
MAX_WAIT_SECONDS = 86_400.0


def wait_seconds(value: str) -> float:
    """``--wait``: seconds to wait for the running services, 0 to a day (-1 once moved the pointer with no
    wait at all, and said the services "did not follow within -1 s")."""
    import argparse
    import math

    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_WAIT_SECONDS):
        raise argparse.ArgumentTypeError(f"{value} must be 0 to {MAX_WAIT_SECONDS:.0f} seconds")
    return seconds


class Interrupted(BaseException):
    """SIGINT or SIGTERM during a move, after the pointer was put back (one line printed); the command
    exits 128 + the signal's number (130, 143), as a shell reports a process the signal ended."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Stop(BaseException):
    """Raised by the signal handler inside a move; BaseException, so no ``except Exception`` takes it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Guard:
    """SIGINT and SIGTERM raise ``_Stop`` while ``armed``; disarmed (the move decided, or being undone),
    a signal is only noted, so that putting the pointer back and writing the record are never cut short."""

    def __init__(self) -> None:
        self.armed = True
        self.noted: list[int] = []

    def __call__(self, signum: int, frame: Any) -> None:
        self.noted.append(signum)
        if self.armed:
            self.armed = False
            raise _Stop(signum)


@contextlib.contextmanager
def _handled(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """``handler`` for SIGINT and SIGTERM for the block, the previous handlers after it; a signal the
    command was started ignoring stays ignored, and off the main thread (where Python delivers no
    signals) the block runs unguarded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS  # ignored (nohup): left so
              if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for signum, previous in before.items():
            signal.signal(signum, previous)


def move(name: str, tag: str, action: str, details: dict[str, Any], wait: float, verb: str,
         decision: dict[str, Any] | None = None) -> int:
    """Point production at ``tag`` and wait until every running service serves it; if one cannot load it,
    or the command is interrupted first, put the pointer back. ``decision``: the line ``decisions.jsonl``
    gets once the pointer has moved (a promotion's; a rollback records only an attempt that failed)."""
    before = read_pointer(name)
    previous = before["tag"] if before else None
    context = {"tag": tag, "production": previous, **details}
    guard = _Guard()
    with _handled(guard):
        try:
            return _move(name, tag, action, details, wait, verb, decision, before, context, guard)
        except _Stop as stop:
            guard.armed = False  # a second Ctrl-C while the pointer goes back is only noted
            _put_back(name, tag, before, context, stop.signum)
            raise Interrupted(stop.signum) from None


def _put_back(name: str, tag: str, before: dict[str, Any] | None, context: dict[str, Any], signum: int) -> None:
    """Undo an interrupted move: the pointer as it was, the attempt on the record, one line."""
    previous, why = context["production"] or "nothing", signal.Signals(signum).name
    try:
        moved = (read_pointer(name) or {}).get("tag") == tag and previous != tag
        restore_pointer(before, name)
    except (OSError, PromotionError) as e:
        print(f"interrupted ({why}), and the production pointer could not be put back ({e}): see "
              f"`han-model status {name}`", file=sys.stderr, flush=True)
        return
    with contextlib.suppress(OSError):  # the pointer is what serves; a record lost to a full disk is not
        record_decision(name, {**context, "decision": f"{'put back' if moved else 'not moved'}: interrupted",
                               "reason": why})
    print(f"interrupted ({why}): production stays on {previous}"
          + (f"; the pointer, moved to {tag}, was put back" if moved else f"; {tag} was not put in production"),
          file=sys.stderr, flush=True)


def _move(name: str, tag: str, action: str, details: dict[str, Any], wait: float, verb: str,
          decision: dict[str, Any] | None, before: dict[str, Any] | None, context: dict[str, Any],
          guard: _Guard) -> int:
    """The move itself. The running services are the check that counts (each loads the version where it
    will serve, beside the serving one, in about a second); with none running, the version is loaded
    here before the pointer moves."""
    previous = context["production"]
    replicas = live_replicas(name, following=True)
    if not replicas:
        try:
            load_checked(tag)
        except Exception as e:
            record_decision(name, {**context, "decision": "not moved: it does not load", "reason": _reason(e)})
            raise PromotionError(f"cannot make {tag} the production version: it does not load ({_reason(e)}); "
                                 f"production stays on {previous or 'nothing'}") from None
        set_pointer(tag, action, details)
        guard.armed = False  # done: what is left is saying so
        _record(name, decision)
        print(f"{verb} {tag} (was {previous or 'nothing'}). Note: no running service follows {name} right now "
              f"(none reported in the last seconds); services started from now serve {tag}.")
        return 0
    set_pointer(tag, action, details)
    stamp = list(pointer_stamp(name) or [])
    deadline = time.monotonic() + wait
    while True:
        now = live_replicas(name, following=True)
        reports, gone = {k: now[k] for k in replicas if k in now}, sorted(k for k in replicas if k not in now)
        failed = {key: r["failed"]["reason"] for key, r in reports.items()  # for this move, not an earlier one
                  if (r.get("failed") or {}).get("tag") == tag and list(r["failed"].get("pointer") or []) == stamp}
        if failed:
            guard.armed = False
            restore_pointer(before, name)
            key, reason = next(iter(failed.items()))
            record_decision(name, {**context, "decision": f"put back: it does not load in {key}", "reason": reason})
            raise PromotionError(f"cannot make {tag} the production version: it does not load in the service {key} "
                                 f"({reason}); production stays on {previous or 'nothing'}")
        waiting = sorted(key for key, r in reports.items() if r.get("serving") != tag)
        if not waiting and not gone:
            guard.armed = False
            _record(name, decision)
            print(f"{verb} {tag} (was {previous or 'nothing'}): {len(reports)} service worker(s) serve it")
            return 0
        if not waiting or time.monotonic() > deadline:
            guard.armed = False  # the pointer stays: the services that answered serve it
            unconfirmed = (f"of {len(replicas)} service worker(s), "
                           + (f"{len(waiting)} did not follow within {wait:g} s ({', '.join(waiting)})"
                              if waiting else "")
                           + ("; " if waiting and gone else "")
                           + (f"{len(gone)} stopped reporting before they did ({', '.join(gone)})" if gone else ""))
            _record(name, decision and {**decision, "unconfirmed": unconfirmed})
            print(f"{verb} {tag} (was {previous or 'nothing'}), but {unconfirmed}: see `han-model status {name}`",
                  file=sys.stderr)
            return 1
        time.sleep(0.25)


def _record(name: str, decision: dict[str, Any] | None) -> None:
    if decision is not None:
        record_decision(name, decision)


def _reason(e: BaseException) -> str:
    return f"{e.__class__.__name__}: {e}".splitlines()[0]
