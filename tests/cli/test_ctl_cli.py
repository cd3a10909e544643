"""`ddptop ctl` from a second terminal against a running headless job: set, status, bad input, stop."""

from __future__ import annotations

import os
import subprocess
import time

import psutil

from test_run_cli import DDPTOP, TINY, assert_one_line_error


def ctl(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(DDPTOP + ["ctl", *args], capture_output=True, text=True, timeout=60, env=env)


def wait_for_status(env: dict, deadline_s: float = 60) -> str:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        result = ctl("status", env=env)
        if result.returncode == 0:
            return result.stdout
        time.sleep(0.5)
    raise AssertionError(f"the job never answered: {result.stderr}")


def test_ctl_changes_a_running_job_and_stops_it(tmp_path):
    env = {**os.environ, "DDPTOP_STATE_DIR": str(tmp_path / "jobs")}  # job files of this test only
    job = subprocess.Popen(DDPTOP + ["--local", "2", "--steps", "100000", "--strategy", "ddp", "--log-every", "50",
                                     *TINY], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        status = wait_for_status(env)
        assert "running" in status and "ddp bucket=25MB batch=16" in status and "rank 1" in status
        result = ctl("set", "strategy=allreduce", "async_op=true", env=env)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("applied at step ")
        assert "allreduce async batch=16" in ctl("status", env=env).stdout
        # settings that mean nothing for the strategy in force are refused, never shown as in force
        assert_one_line_error(ctl("set", "bucket_mb=10", env=env), 2, "bucket_mb applies only to ddp")
        assert_one_line_error(ctl("set", "strategy=ddp", "async_op=true", env=env), 2, "async_op applies only")
        assert_one_line_error(ctl("set", "batch_size=0", env=env), 2, "batch size")
        assert_one_line_error(ctl("set", "strategy=ring", env=env), 2, "strategy")
        assert_one_line_error(ctl("set", "nonsense", env=env), 2, "KEY=VALUE")
        assert_one_line_error(ctl("--token", "wrong-token-1", "set", "strategy=ddp", env=env), 1, "bad MAC")
        children = psutil.Process(job.pid).children(recursive=True)
        assert len(children) >= 2
        result = ctl("stop", env=env)
        assert result.returncode == 0, result.stderr
        out, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err
    assert "now allreduce async batch=16" in out and "finished: " in out and "(stopped)" in out
    time.sleep(0.5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert_one_line_error(ctl("status", env=env), 4, "no ddptop job")


def test_ctl_with_no_job_at_that_address_says_so(tmp_path):
    env = {**os.environ, "DDPTOP_STATE_DIR": str(tmp_path)}
    from ddptop.control.store import free_port

    result = ctl("--master", "127.0.0.1", "--port", str(free_port()), "--token", "abcdefgh1", "status", env=env)
    assert_one_line_error(result, 4, "cannot reach")


def test_attach_watches_a_running_job_and_detaching_leaves_it_running(tmp_path):
    env = {**os.environ, "DDPTOP_STATE_DIR": str(tmp_path / "jobs")}
    job = subprocess.Popen(DDPTOP + ["--local", "2", "--steps", "100000", "--log-every", "1000", *TINY],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for_status(env)
        watcher = subprocess.Popen(DDPTOP + ["attach", "--headless", "--log-every", "20"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 60
        lines = []
        while time.monotonic() < deadline and sum(line.startswith("step ") for line in lines) < 2:
            lines.append(watcher.stdout.readline())
        watcher.send_signal(2)  # Ctrl-C: detach
        out, err = watcher.communicate(timeout=30)
        assert watcher.returncode == 0 and "detached; the job goes on" in err and "Traceback" not in err
        assert sum(line.startswith("step ") for line in lines) >= 2
        before = int(ctl("status", "--json", env=env).stdout.split('"step": ')[1].split(",")[0])
        time.sleep(1.5)
        after = int(ctl("status", "--json", env=env).stdout.split('"step": ')[1].split(",")[0])
        assert after > before  # still training
        assert ctl("stop", env=env).returncode == 0
        job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0


def test_a_sweep_reports_segment_0_everywhere_and_refuses_set(tmp_path):
    """A profile whose sweep starts with `single` while the flags say ddp: everything shows `single` (what runs),
    and a `set` during the sweep is refused with the reason instead of being merged into it."""
    profile = tmp_path / "two.toml"
    profile.write_text('[run]\nmodel = "tiny"\n[sweep]\nwarmup = 0\nmeasure = 1000\n'
                       'configs = [{ strategy = "single" }, { strategy = "ddp", bucket_mb = 5 }]\n')
    env = {**os.environ, "DDPTOP_STATE_DIR": str(tmp_path / "jobs"), "DDPTOP_TEST_MODEL": "sleep-ms=20"}
    record = tmp_path / "sweep.db"
    job = subprocess.Popen(DDPTOP + ["--local", "2", "--profile", str(profile), "--strategy", "ddp", "--record",
                                     str(record), *TINY], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env)
    try:
        status = wait_for_status(env)
        assert "single batch=16" in status and "segment 0" in status, status
        assert_one_line_error(ctl("set", "lr=0.05", env=env), 1, "sweep")
        assert "single batch=16" in ctl("status", env=env).stdout
        assert ctl("stop", env=env).returncode == 0
        out, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err
    first = next(line for line in out.splitlines() if line.startswith("training "))
    assert ", single, batch 16/rank" in first
    info = subprocess.run(DDPTOP + ["info", str(record)], capture_output=True, text=True, timeout=60)
    assert "single batch=16" in info.stdout and "ddp" not in info.stdout.split("segments")[1].splitlines()[2]
