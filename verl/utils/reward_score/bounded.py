"""Scoring calls with a deadline.

A scoring function is user code: it may loop forever, sleep on a network call or get stuck in a
C extension. The reward managers bound every call with `reward_model.reward_kwargs.timeout`
seconds in one of two ways:

- `call_with_alarm` (in the calling process): only in the main thread, where SIGALRM can
  interrupt Python code and sleeps. The timeout is raised as `ScoreTimeout`, a BaseException, so
  an `except Exception` in the scorer does not swallow it.
- `ScorerPool` (worker processes): anywhere else (a thread, a Ray actor's executor thread) and for
  the `prime` manager. Each worker process runs one call at a time; a call past its deadline gets
  its process killed and a fresh process started in its place, so one stuck call costs one
  timeout, never the batch, and no stuck thread is left behind. Workers exit on their own when
  the parent goes away (their pipe closes).

This module imports neither torch nor the reward managers, so a worker process starts quickly.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing as mp
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait as wait_connections
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["ScoreTimeout", "CallOutcome", "alarm_available", "call_with_alarm", "callable_name", "ScorerPool"]

# seconds a fresh worker process may take to import the user files and be ready
WORKER_START_TIMEOUT_S = 300.0
# workers of one pool that may die while starting before the pool gives up (a transient failure
# is retried; a scorer that cannot be imported fails every time)
MAX_START_FAILURES = 3


class ScoreTimeout(BaseException):
    """A scoring call ran past its deadline."""


class CallOutcome:
    """Result of one bounded call: `value` when `ok`, else `error` (message), `traceback`, and
    `timed_out`; `fallbacks` counts math_verify fallbacks that happened during the call."""

    __slots__ = ("ok", "value", "error", "traceback", "timed_out", "fallbacks")

    def __init__(
        self, ok: bool, value: Any = None, error: str = "", tb: str = "", timed_out: bool = False, fallbacks: int = 0
    ):
        self.ok, self.value, self.error, self.traceback = ok, value, error, tb
        self.timed_out, self.fallbacks = timed_out, fallbacks

    def __repr__(self) -> str:
        return f"CallOutcome(ok={self.ok}, value={self.value!r}, error={self.error!r}, timed_out={self.timed_out})"


def callable_name(fn: Callable) -> str:
    """`module.qualname` of a function (of the wrapped one for a functools.partial)."""
    inner = getattr(fn, "func", fn)
    mod = getattr(inner, "__module__", None) or ""
    name = getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None) or type(inner).__name__
    return f"{mod}.{name}" if mod else name


def _fallback_count() -> int:
    # lazy: the math scorer (and math_verify) is only imported if a call used it
    import sys

    mod = sys.modules.get("verl.utils.reward_score.math")
    return mod.math_verify_fallbacks() if mod is not None else 0


def alarm_available() -> bool:
    """SIGALRM-based deadlines work here (the main thread of a POSIX process)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def call_with_alarm(fn: Callable, kwargs: dict, timeout: float | None) -> CallOutcome:
    """Call `fn(**kwargs)` in this thread (the main thread), interrupted after `timeout` s.

    A scorer stuck in native code that never returns to the interpreter is not interrupted;
    such scorers belong in the `prime` manager (worker processes).
    """
    before = _fallback_count()

    def on_alarm(signum, frame):
        raise ScoreTimeout(f"the call ran longer than its timeout of {timeout} s")

    old_handler = None
    outer = (0.0, 0.0)
    start = time.monotonic()
    try:
        if timeout is not None:
            old_handler = signal.signal(signal.SIGALRM, on_alarm)
            outer = signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            value = fn(**kwargs)
        finally:
            if timeout is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old_handler)
                if outer[0] > 0:  # someone else's timer was running: give it back what is left
                    signal.setitimer(signal.ITIMER_REAL, max(outer[0] - (time.monotonic() - start), 1e-3), outer[1])
        return CallOutcome(True, value, fallbacks=_fallback_count() - before)
    except ScoreTimeout as exc:
        return CallOutcome(False, error=f"TimeoutError: {exc}", timed_out=True, fallbacks=_fallback_count() - before)
    except NotImplementedError:
        raise  # no scorer for the data source: a configuration error (see the reward managers)
    except Exception as exc:  # noqa: BLE001 - reported and counted by the reward manager
        return CallOutcome(
            False, error=f"{type(exc).__name__}: {exc}", tb=traceback.format_exc(), fallbacks=_fallback_count() - before
        )


# ---------------------------------------------------------------------------------------- workers
def _worker_main(conn, user_files: list[str], fn_bytes: bytes) -> None:
    """Body of a worker process: import the user files, unpickle the function, serve calls."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business; it kills us
    try:
        from verl.utils.import_utils import import_external_libs

        import_external_libs(user_files)
        fn = pickle.loads(fn_bytes)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("init_error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        return
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if msg is None:
            return
        idx, kwargs = msg
        before = _fallback_count()
        try:
            out = ("ok", fn(**kwargs), "", "")
        except NotImplementedError as exc:
            out = ("config_error", None, f"NotImplementedError: {exc}", traceback.format_exc())
        except Exception as exc:  # noqa: BLE001 - sent back, counted by the parent
            out = ("error", None, f"{type(exc).__name__}: {exc}", traceback.format_exc())
        fallbacks = _fallback_count() - before
        try:
            conn.send((idx, out, fallbacks))
        except Exception as exc:  # noqa: BLE001 - e.g. a result that does not pickle
            conn.send(
                (idx, ("error", None, f"the result {type(out[1]).__name__} cannot be sent back: {exc}", ""), fallbacks)
            )


class _Slot:
    __slots__ = ("proc", "conn", "ready", "started", "job", "deadline")

    def __init__(self, proc, conn):
        self.proc, self.conn, self.ready, self.started = proc, conn, False, time.monotonic()
        self.job: int | None = None
        self.deadline: float | None = None


class ScorerPool:
    """`num_processes` spawned worker processes calling `fn(**kwargs)`, one call each at a time.

    Args:
        fn: the scoring function; it must pickle (a module-level function or a functools.partial
            of one); the modules of `user_files` are imported in each worker first.
        num_processes: worker processes (>= 1).
        user_files: .py files to import in each worker (so that functions defined there unpickle).
        what: name of the function for messages.
    """

    def __init__(self, fn: Callable, num_processes: int, user_files: list[str] | None = None, what: str | None = None):
        self.what = what or callable_name(fn)
        try:
            self._fn_bytes = pickle.dumps(fn)
        except Exception as exc:  # noqa: BLE001
            raise TypeError(
                f"the scoring function {self.what} must run in a worker process (its timeout cannot be enforced "
                f"in this thread otherwise) but it cannot be pickled: {exc}. Define it at module level in a file "
                "(custom_reward_function.path), or set reward_model.reward_kwargs.timeout=null to run it unbounded"
            ) from exc
        self.num_processes = int(num_processes)
        self.user_files = list(user_files or [])
        self._ctx = mp.get_context("spawn")
        self._slots: list[_Slot | None] = [None] * self.num_processes
        self.restarts = 0  # worker processes replaced after a timeout or a crash
        self.start_failures = 0  # workers that died before they were ready (a persistent cause raises)

    # -- process management --------------------------------------------------------------------
    def _start(self, i: int) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_worker_main, args=(child, self.user_files, self._fn_bytes), daemon=True, name=f"verl-scorer-{i}"
        )
        proc.start()
        child.close()
        self._slots[i] = _Slot(proc, parent)

    def _kill(self, i: int) -> None:
        slot = self._slots[i]
        self._slots[i] = None
        if slot is None:
            return
        try:
            slot.conn.close()
        except OSError:
            pass
        if slot.proc.is_alive():
            slot.proc.kill()
        slot.proc.join(5)

    def close(self) -> None:
        """Stop every worker process (killed: a worker may be stuck in a call)."""
        for i in range(len(self._slots)):
            self._kill(i)

    def pids(self) -> list[int]:
        return [s.proc.pid for s in self._slots if s is not None]

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- calls ---------------------------------------------------------------------------------
    def run(self, calls: list[dict], timeout: float | None) -> list[CallOutcome]:
        """Run `fn(**calls[i])` for every i, each call bounded by `timeout` seconds from the moment
        a ready worker received it. Returns one `CallOutcome` per call, in order."""
        results: list[CallOutcome | None] = [None] * len(calls)
        todo = collections.deque(range(len(calls)))
        for i, slot in enumerate(self._slots):
            if slot is None or not slot.proc.is_alive():
                self._kill(i)
                self._start(i)
        try:
            while todo or any(s is not None and s.job is not None for s in self._slots):
                self._dispatch(todo, calls, timeout)
                self._wait_and_collect(results, todo, calls, timeout)
        except BaseException:
            self.close()  # unknown state (Ctrl-C, an init error): no half-used worker is kept
            raise
        return results  # type: ignore[return-value]

    def _dispatch(self, todo, calls, timeout) -> None:
        for slot in self._slots:
            if not todo:
                return
            if slot is not None and slot.ready and slot.job is None:
                idx = todo.popleft()
                slot.job = idx
                slot.deadline = None if timeout is None else time.monotonic() + timeout
                try:
                    slot.conn.send((idx, calls[idx]))
                except (OSError, ValueError):
                    todo.appendleft(idx)  # the worker died meanwhile; _wait_and_collect replaces it
                    slot.job = None
                    slot.proc.kill()

    def _wait_and_collect(self, results, todo, calls, timeout) -> None:
        now = time.monotonic()
        live = [(i, s) for i, s in enumerate(self._slots) if s is not None]
        deadlines = [s.deadline for _, s in live if s.job is not None and s.deadline is not None]
        deadlines += [s.started + WORKER_START_TIMEOUT_S for _, s in live if not s.ready]
        wait_s = max(min(deadlines) - now, 0.0) if deadlines else None
        ready = wait_connections([s.conn for _, s in live] + [s.proc.sentinel for _, s in live], timeout=wait_s)
        for i, slot in live:
            if slot.conn in ready or slot.proc.sentinel in ready:
                self._receive(i, slot, results, todo)
        now = time.monotonic()
        for i, slot in enumerate(self._slots):
            if slot is None:
                continue
            if slot.job is not None and slot.deadline is not None and now >= slot.deadline:
                results[slot.job] = CallOutcome(
                    False,
                    error=f"TimeoutError: the call ran longer than its timeout of "
                    f"{timeout} s (its worker process was killed)",
                    timed_out=True,
                )
                self._replace(i)
            elif not slot.ready and now >= slot.started + WORKER_START_TIMEOUT_S:
                raise RuntimeError(
                    f"a scoring worker process for {self.what} did not start within {WORKER_START_TIMEOUT_S:.0f} s"
                )

    def _receive(self, i: int, slot: _Slot, results, todo) -> None:
        try:
            while slot.conn.poll():
                msg = slot.conn.recv()
                if msg[0] == "ready":
                    slot.ready = True
                elif msg[0] == "init_error":
                    raise RuntimeError(f"a scoring worker process could not load {self.what}: {msg[1]}\n{msg[2]}")
                else:
                    idx, (kind, value, error, tb), fallbacks = msg
                    if kind == "config_error":
                        raise NotImplementedError(error.split(": ", 1)[-1])
                    results[idx] = CallOutcome(kind == "ok", value, error, tb, fallbacks=fallbacks)
                    slot.job, slot.deadline = None, None
        except (EOFError, OSError):
            pass
        if not slot.proc.is_alive():
            slot.proc.join(1)
            if slot.job is not None:
                results[slot.job] = CallOutcome(
                    False, error=f"the scoring worker process died during the call (exit code {slot.proc.exitcode})"
                )
            elif not slot.ready:
                self.start_failures += 1
                if self.start_failures <= MAX_START_FAILURES:
                    logger.warning(
                        "a scoring worker process for %s exited while starting (exit code %s); starting another",
                        self.what,
                        slot.proc.exitcode,
                    )
                    self._replace(i)
                    return
                raise RuntimeError(
                    f"a scoring worker process for {self.what} exited while starting "
                    f"(exit code {slot.proc.exitcode}; its error is printed above). A script that "
                    "scores at import time needs an `if __name__ == '__main__':` guard (spawned "
                    "processes import the main module)"
                )
            self._replace(i)

    def _replace(self, i: int) -> None:
        self._kill(i)
        self.restarts += 1
        self._start(i)  # started now, so it is (nearly) ready when the next call needs it
