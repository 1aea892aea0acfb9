"""Tie the processes of a private Ray session to the driver that started it.

`ray.init()` (local) starts GCS, raylet, agents and worker processes as descendants of the
driver. When the driver is killed with SIGKILL, `ray.shutdown()` never runs: the raylet and the
workers notice and exit, but Ray's dashboard and runtime-env agents log "Raylet is dead!
Exiting" and stay alive (measured with Ray 2.60: 2 of 9 processes still alive 30 s later),
holding memory and sockets until someone kills them by hand.

`start(session_dir)` launches this module as a small separate process holding the read end of a
pipe whose write end only the driver has. The watchdog notes the driver's descendants every
`POLL_S` seconds; when the pipe reaches end-of-file (the driver is gone, however it ended) it
terminates every noted process still alive (same pid and start time, so a reused pid is never
hit) and every process whose command line names the session directory, SIGKILL after
`GRACE_S` seconds for those that ignore SIGTERM. After a clean `ray.shutdown()` there is nothing
left to kill and it just exits.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

POLL_S = 1.0
GRACE_S = 3.0

__all__ = ["start"]


def start(session_dir: str | None) -> subprocess.Popen | None:
    """Start the watchdog of this (driver) process; returns it, or None when it cannot run here
    (no psutil, not POSIX). The pipe's write end stays open in this process until it exits."""
    if os.name != "posix":
        return None
    try:
        import psutil  # noqa: F401 - needed by the watchdog process
    except ImportError:
        return None
    # run as a file (it imports nothing of verl): works whatever sys.path the driver had
    args = [sys.executable, os.path.abspath(__file__), str(os.getpid()), session_dir or ""]
    # its own session: a Ctrl-C or a signal to the driver's process group does not reach it
    proc = subprocess.Popen(
        args,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        start_new_session=True,
    )
    # keep the write end open for the driver's lifetime; os.set_inheritable(False) is the default
    # for pipes, so Ray's children do not hold it (they would keep the watchdog from waking)
    return proc


def _snapshot(driver, me: int, known: dict) -> None:
    import psutil

    try:
        for child in driver.children(recursive=True):
            if child.pid != me:
                try:
                    known[child.pid] = child.create_time()
                except psutil.Error:
                    pass
    except psutil.Error:
        pass


def _session_processes(session_dir: str, me: int) -> list:
    import psutil

    found = []
    if not session_dir:
        return found
    uid = os.getuid()
    for proc in psutil.process_iter(["pid", "uids", "cmdline"]):
        try:
            if proc.pid == me or proc.info["uids"] is None or proc.info["uids"].real != uid:
                continue
            cmd = " ".join(proc.info["cmdline"] or [])
            if session_dir in cmd:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _reap(known: dict, session_dir: str, me: int) -> int:
    import psutil

    targets = {}
    for pid, created in known.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created:
                targets[pid] = proc
        except psutil.Error:
            continue
    for proc in _session_processes(session_dir, me):
        targets.setdefault(proc.pid, proc)
    for proc in targets.values():
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(list(targets.values()), timeout=GRACE_S)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    return len(targets)


def _main(driver_pid: int, session_dir: str) -> None:
    import psutil

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the terminal is for the driver
    me = os.getpid()
    known: dict[int, float] = {}
    try:
        driver = psutil.Process(driver_pid)
    except psutil.Error:
        driver = None
    stdin = sys.stdin.buffer
    session_seen = False
    tick = 0
    while True:
        if driver is not None:
            _snapshot(driver, me, known)
        if session_dir and tick % 5 == 0:
            # a session shut down cleanly while the driver goes on (several runs in one process):
            # nothing left to guard
            alive = bool(_session_processes(session_dir, me))
            if session_seen and not alive:
                return
            session_seen = session_seen or alive
        tick += 1
        ready, _, _ = select.select([stdin], [], [], POLL_S)
        if ready and not os.read(stdin.fileno(), 4096):
            break  # end of file: the driver is gone
    # a driver that exits normally has shut Ray down already; give a shutdown in progress a moment
    time.sleep(0.5)
    _reap(known, session_dir, me)


if __name__ == "__main__":
    _main(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "")
