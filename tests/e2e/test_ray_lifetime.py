"""The private Ray of a run listens on loopback only, and dies with its driver: a driver killed
with SIGKILL leaves no Ray process behind (issue 15; before: 2 agents still alive 30 s later,
and every socket bound to all interfaces)."""

import ipaddress
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

psutil = pytest.importorskip("psutil")

pytestmark = [pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DRIVER = textwrap.dedent(
    """
    import time

    import ray

    from verl.trainer.main_ppo import _init_ray

    _init_ray({"num_cpus": 1})


    @ray.remote(num_cpus=0)
    class Worker:
        def pid(self):
            import os

            return os.getpid()


    workers = [Worker.remote() for _ in range(2)]
    print("READY", *ray.get([w.pid.remote() for w in workers]), flush=True)
    time.sleep(600)
    """
)


def _alive(procs):
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def test_private_ray_listens_on_loopback_and_dies_with_a_killed_driver(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for key in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        env.pop(key, None)
    driver = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    procs = []
    try:
        line = driver.stdout.readline()
        assert line.startswith("READY"), line
        worker_pids = {int(x) for x in line.split()[1:]}
        time.sleep(1)
        procs = psutil.Process(driver.pid).children(recursive=True)
        assert worker_pids <= {p.pid for p in procs}
        listening = []
        for p in procs + [psutil.Process(driver.pid)]:
            try:
                listening += [
                    (p.name(), c.laddr.ip, c.laddr.port)
                    for c in p.net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN
                ]
            except psutil.Error:
                continue
        assert len(listening) >= 4  # GCS, raylet, driver, workers
        exposed = [x for x in listening if not ipaddress.ip_address(x[1].removeprefix("::ffff:")).is_loopback]
        assert not exposed, f"listening beyond loopback: {exposed}"

        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(10)
        deadline = time.monotonic() + 20
        while _alive(procs) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = [(p.pid, p.name()) for p in _alive(procs)]
        assert not left, f"left behind 20 s after the driver was killed: {left}"
    finally:
        if driver.poll() is None:
            driver.kill()
        for p in _alive(procs):
            p.kill()
