"""The GPU checks of issue 17, for a session that has a GPU machine: what the CPU development machine cannot run.

    scripts/gpu_check.sh cuda | oom | sharded | bench | suite [pytest args]     (from the repository root; logs go to $OUT)

Each check prints `PASS name: what it saw` or `FAIL name: ...`; the exit code is the number of failures.
`--cpu` runs the same plumbing on a CPU machine (gloo, the tiny model, the test-only OOM hook, no NVML) to check the
script itself, leaving out what means nothing without a GPU; `make test` runs `cuda --cpu` and `oom --cpu`
(tests/gpu/test_gpu_check_cpu.py). tests/gpu/test_cuda.py calls these checks one by one on a GPU machine.

- cuda:  nccl with world size 1; the default placement (one rank per GPU); the one-line refusal of 2 nccl ranks on
         one GPU; 2 ranks with gloo on CUDA tensors (allreduce, ddp; gather-scatter refused); CUDA-event spans;
         GPU step time against the wall clock; NVML numbers against torch's and nvidia-smi's; the NVML device when
         CUDA_VISIBLE_DEVICES names a UUID; no synchronizing CUDA call on the training thread during steps; each
         memory sample's parameters, gradients and momentum are torch's sizes of the model, its peak the CUDA
         allocator's (at least what is held, at most what is reserved).
- oom:   a real CUDA out-of-memory: `ctl set` of a batch that does not fit rolls back and the job trains on; the
         memory comes back; the hpml-lab4-q1 profile grows the batch until it does not fit.
- sharded: issue 43's strategies on the device: a sweep ddp -> zero3 -> zero1 -> zero2 -> single -> ddp in one job
         (nccl, world size 1; --cpu: gloo, 2 ranks), every switch on one step with one fingerprint, each
         segment's memory by kind from the CUDA allocator against torch's sizes of the model divided as the
         strategy shards it, a peak at least what is held; then zero1 with 2 gloo ranks on CUDA tensors.
- bench: step time of plain torch, ddptop --probes off and --probes all on VGG-11 and ResNet-18 (separate runs,
         interleaved, wall clock from the recordings' step end times), then the repository's CPU benchmarks.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DDPTOP = [sys.executable, "-m", "ddptop"]
OUT = Path(os.environ.get("OUT") or "/tmp/ddptop-gpu")
FAILED: list[str] = []
CPU = False  # --cpu: a dry run of the plumbing on a machine without a GPU


def check(name: str, ok: bool, detail: str = "") -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        FAILED.append(name)
    return ok


def ddptop(*args: str, timeout: float = 540, env: dict | None = None, log: str = "") -> subprocess.CompletedProcess:
    result = subprocess.run(DDPTOP + list(args), capture_output=True, text=True, timeout=timeout,
                            env={"DDPTOP_RUNS_DIR": str(OUT / "runs"), **os.environ, **(env or {})})
    if log:
        (OUT / f"{log}.log").write_text(f"$ ddptop {' '.join(args)}\nexit {result.returncode}\n--- stdout\n"
                                        f"{result.stdout}\n--- stderr\n{result.stderr}")
    return result


def fresh(name: str) -> str:
    path = OUT / name
    path.unlink(missing_ok=True)
    return str(path)


def rows(db: str, sql: str) -> list:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def events(db: str, kind: str) -> list[dict]:
    return [json.loads(data) for (data,) in rows(db, f"SELECT data FROM events WHERE kind = '{kind}' ORDER BY seq")]


def backend() -> list[str]:
    return ["--backend", "gloo"] if CPU else ["--backend", "nccl"]


def small_batch() -> list[str]:
    """--cpu: batch 8 of a 1,600-image set where the run's checks do not depend on either (the default 64 made a
    tiny-model step ~130 ms of both cores, most of a dry run's CPU); on a GPU the defaults, as ever."""
    return ["--batch-size", "8", "--synthetic-size", "1600"] if CPU else []


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# ---- cuda ---------------------------------------------------------------------------------------------------------

def check_cuda() -> None:
    db = run_nccl1()
    if not db:
        return
    check_spans(db)
    check_memory(db)
    check_gpu_time(db)
    check_nvml(db)
    check_placement()
    check_gloo_on_cuda()
    check_uuid_mapping()
    check_no_sync_on_the_training_thread()


def run_nccl1() -> str:
    """A 1-rank nccl run (VGG-11, 60 steps; --cpu: gloo, the tiny model at batch 8, 25 steps): its recording, '' if
    it failed."""
    db = fresh("nccl1.db")
    model, steps = ("tiny", "25") if CPU else ("vgg11", "60")
    run = ddptop("--headless", "--local", "1", *backend(), "--model", model, *small_batch(), "--steps", steps,
                 "--span-every", "5", "--no-eval", "--record", db, log="nccl1")
    if not check("nccl world size 1", run.returncode == 0, run.stderr.strip().splitlines()[-1:]):
        return ""
    (joined,) = events(db, "rank_joined")
    check("rank on cuda:0 with nccl", CPU or (joined["device"], joined["backend"]) == ("cuda:0", "nccl"),
          f"{joined['device']} {joined['backend']}, sockets on {joined.get('gloo_ifname')}/{joined.get('nccl_ifname')}")
    return db


def check_spans(db: str) -> None:
    sampled = rows(db, "SELECT step, spans FROM spans WHERE rank = 0 ORDER BY step")
    iters = dict(rows(db, "SELECT step, iter_s FROM steps WHERE rank = 0"))
    bad, kinds = [], set()
    for step, blob in sampled:
        spans = json.loads(blob)
        kinds.update(s[0] for s in spans)
        bad += [s for s in spans if not (0 <= s[2] and 0 <= s[3] <= iters.get(step, 0) * 1.05 + 1e-3)]
    check("CUDA-event spans", sampled and {"fwd", "bwd", "comm", "opt"} <= kinds and not bad,
          f"{len(sampled)} sampled steps, kinds {sorted(kinds)}, {len(bad)} spans outside their step")


def check_memory(db: str) -> None:
    """Issue 43: each memory sample's kinds are torch's sizes of the same model (SGD momentum: one buffer per
    parameter), measured by the CUDA allocator (--cpu: the unique memory); the peak holds at least the kinds and at
    most what the allocator reserved."""
    from ddptop.train.models import build_model  # imports torch: only here, the other checks run subprocesses

    size = sum(p.numel() * p.element_size() for p in build_model("tiny" if CPU else "vgg11").parameters())
    samples = rows(db, "SELECT step, param_bytes, grad_bytes, optim_bytes, peak_bytes, reserved_bytes, by "
                       "FROM memory WHERE rank = 0 ORDER BY seq")
    by = "process USS" if CPU else "cuda allocator"
    kinds = {(p, g, o, b) for _, p, g, o, _, _, b in samples}
    bounds = all(3 * size <= peak <= (reserved if not CPU else peak) for *_, peak, reserved, _ in samples)
    check("memory by kind", bool(samples) and kinds == {(size, size, size, by)} and bounds,
          f"{len(samples)} samples; {sorted(kinds)} against {size} B of parameters by torch; peaks "
          f"{[round(s[4] / 1e6, 1) for s in samples]} MB, reserved {[round(s[5] / 1e6, 1) for s in samples]} MB")


def check_gpu_time(db: str) -> None:
    """Step time on GPU is device time between boundary events; in steady state it must match the wall clock."""
    steps = rows(db, "SELECT step, t, iter_s, sampled FROM steps WHERE rank = 0 AND step >= 10 ORDER BY step")
    wall = (steps[-1][1] - steps[0][1]) / (len(steps) - 1)
    device = statistics.fmean(s[2] for s in steps[1:])
    check("GPU step time vs wall clock", 0.8 < device / wall < 1.2,
          f"mean step {device * 1e3:.2f} ms by CUDA events, {wall * 1e3:.2f} ms by the wall clock ({device / wall:.3f})")


def check_nvml(db: str) -> None:
    if CPU:
        return
    import torch

    samples = rows(db, "SELECT gpus, gpu_status FROM system WHERE rank = 0 ORDER BY seq")
    stats = [json.loads(g)[0] for g, status in samples if status == "ok" and json.loads(g)]
    names = ["index", "name", "util", "used", "total", "power", "temp", "sm_clock", "pcie_rx", "pcie_tx", "nvlink_rx",
             "nvlink_tx", "proc_mem", "uuid"]
    if not check("NVML samples", bool(stats), f"{len(stats)} of {len(samples)} samples with a GPU; "
                                              f"statuses {sorted({s for _, s in samples})}"):
        return
    last = dict(zip(names, stats[-1]))
    print("  last GPU sample:", json.dumps(last))
    total = torch.cuda.get_device_properties(0).total_memory
    check("NVML memory total vs torch", abs(last["total"] - total) / total < 0.02, f"{last['total']} vs {total}")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout
    check("NVML uuid vs nvidia-smi", f"{last['index']}, {last['uuid']}" in smi, f"{last['uuid']} in {smi.strip()!r}")
    check("process GPU memory", last["proc_mem"] is not None and 0 < last["proc_mem"] <= last["used"],
          f"process {last['proc_mem']}, GPU {last['used']} (None: NVML does not see this PID namespace)")
    for key in ("util", "power", "temp", "sm_clock", "pcie_rx", "pcie_tx"):
        values = [dict(zip(names, s))[key] for s in stats]
        check(f"NVML {key}", all(v is not None for v in values), f"min {min(values, default=None)}, "
                                                                    f"max {max(values, default=None)}")
    print(f"  NVLink: {last['nvlink_rx']} / {last['nvlink_tx']} bytes/s (None: this GPU has no active NVLink)")


def check_placement() -> None:
    """The refusal of more nccl ranks than GPUs; on a GPU also the default --local and auto's fall-back to gloo
    (without one, tests/unit/test_devices.py and tests/cli/test_run_cli.py check those)."""
    gpus = gpu_count()
    run = ddptop("--headless", "--local", str(gpus + 1), "--backend", "nccl", "--model", "tiny", "--steps", "2",
                 log="refused")
    lines = run.stderr.strip().splitlines()
    check("nccl with two ranks on a GPU is refused", run.returncode == 2 and len(lines) == 1 and
          "--backend gloo" in lines[0], lines)
    if CPU:
        return
    run = ddptop("--headless", "--model", "tiny", "--steps", "5", "--no-eval", log="placement")
    check("--local defaults to the visible GPUs", run.returncode == 0 and f"ddptop: {gpus} ranks" in run.stderr
          and "nccl" in run.stdout, f"{gpus} GPU(s): {[x for x in run.stderr.splitlines() if 'ranks' in x][:1]}")
    run = ddptop("--headless", "--local", str(gpus + 1), "--model", "tiny", "--steps", "3", "--no-eval",
                 log="auto-shared")
    check("auto: more ranks than GPUs train with gloo", run.returncode == 0 and "gloo" in run.stdout,
          [line for line in run.stderr.splitlines() if "GPU" in line][:1])


def check_gloo_on_cuda() -> None:
    device = [] if CPU else ["--device", "cuda"]
    for strategy in ("ddp",) if CPU else ("allreduce", "ddp"):  # --cpu: one is the plumbing of both
        db = fresh(f"gloo-cuda-{strategy}.db")
        run = ddptop("--headless", "--local", "2", "--backend", "gloo", *device, "--model", "tiny", *small_batch(),
                     "--steps", "10", "--strategy", strategy, "--no-eval", "--record", db, log=f"gloo-cuda-{strategy}")
        ok = run.returncode == 0
        if ok:
            joined = {e["rank"]: e["device"] for e in events(db, "rank_joined")}
            prints = {e["fingerprint"] for e in events(db, "run_finished")}
            ok = (CPU or set(joined.values()) == {"cuda:0"} or gpu_count() > 1) and len(prints) == 1
        check(f"2 ranks, gloo on CUDA tensors, {strategy}", ok, run.stderr.strip().splitlines()[-1:])
    if not CPU:  # without a GPU, --device cuda is refused before the strategy is looked at
        run = ddptop("--headless", "--local", "2", "--backend", "gloo", "--device", "cuda", "--strategy",
                     "gather-scatter", "--model", "tiny", "--steps", "2", log="gloo-cuda-gather")
        check("gloo on CUDA refuses gather-scatter", run.returncode == 2, run.stderr.strip())


def check_uuid_mapping() -> None:
    if CPU:
        return
    smi = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip().splitlines()
    index, uuid = [x.strip() for x in smi[-1].split(",")]
    db = fresh("uuid.db")
    run = ddptop("--headless", "--local", "1", "--model", "tiny", "--steps", "8", "--no-eval", "--record", db,
                 env={"CUDA_VISIBLE_DEVICES": uuid[:12]}, log="uuid")  # a UUID prefix, as CUDA accepts
    seen = {json.loads(g)[0][0] for (g,) in rows(db, "SELECT gpus FROM system WHERE gpu_status = 'ok'")} \
        if run.returncode == 0 else set()
    check("NVML device for CUDA_VISIBLE_DEVICES=<uuid prefix>", seen == {int(index)}, f"nvidia-smi index {index}, "
                                                                                       f"recorded {seen}")


def check_no_sync_on_the_training_thread() -> None:
    """Trainer.run in this process under torch's sync debug mode: every synchronizing CUDA call made during the
    run, by the ddptop function it came from. Allowed: the one synchronize at the run's end (StepProbe.close) and
    the model fingerprints (a .cpu() as each segment starts and at the end); anything else is a failure."""
    if CPU:
        return
    import torch

    from ddptop.config import RunConfig, SyncConfig
    from ddptop.probes.clock import CudaClock
    from ddptop.probes.step import StepProbe
    from ddptop.train.loop import Trainer

    for probes in ("off", "all"):
        records: list = []
        cfg = RunConfig(model="vgg11", sync=SyncConfig(strategy="single", batch_size=64), steps=30, eval=False,
                        probes=probes, span_every=5)
        probe = StepProbe(0, CudaClock(), records.append, 5, detail=probes == "all")
        torch.cuda.set_device(0)
        trainer = Trainer(cfg, 0, 1, torch.device("cuda", 0), records.append, probe)
        callers: list[str] = []

        def seen(message, _category=None, filename="?", lineno=0, *_args, **_kwargs):
            if "synchroniz" in str(message):
                stack = traceback.extract_stack()[:-1]
                frames = [f for f in stack if "/ddptop/" in f.filename]
                chain = " < ".join(f"{Path(f.filename).name}:{f.name}" for f in reversed(frames))
                # without a ddptop frame: where the warning says it was raised and the innermost frames, to find it
                outer = " < ".join(f"{Path(f.filename).name}:{f.name}:{f.lineno}" for f in reversed(stack[-4:]))
                callers.append(chain or f"(no ddptop frame, thread {threading.current_thread().name}, raised at "
                                        f"{Path(str(filename)).name}:{lineno}, stack {outer})")

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")  # its own first call warns that it synchronizes: not a step's
            warnings.showwarning = seen
            try:
                trainer.run()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        allowed = ("clock.py:synchronize", "sync_state.py:fingerprint")
        bad = sorted({c for c in callers if not c.startswith(allowed)})
        check(f"no device sync in a step (--probes {probes})", not bad,
              f"{len(callers)} synchronizing calls, from {sorted(set(callers))}")
        resolved = []
        worker = threading.Thread(target=lambda: resolved.extend(
            e for r in records if hasattr(r, "resolve") for e in r.resolve()))
        worker.start()
        worker.join()
        losses = [e.loss for e in resolved if type(e).__name__ == "StepDone"]
        # every step's loss, read after the run (VGG-11 at lr 0.1 spikes to ~14 near step 10 on an H200, then learns)
        check(f"deferred loss (--probes {probes})", len(losses) == 30 and all(0 < x < 100 for x in losses),
              f"{len(losses)} losses, first {losses[:1]}, last {losses[-1:]}")


# ---- oom ----------------------------------------------------------------------------------------------------------

def check_oom() -> None:
    check_live_roll_back()
    if not CPU:  # on the CPU, tests/ranks/test_oom.py runs an until_oom sweep (2 minutes of this profile, here)
        check_q1_profile()


def check_live_roll_back() -> None:
    env = {**os.environ, "DDPTOP_STATE_DIR": str(OUT / "jobs")}
    if CPU:
        env["DDPTOP_TEST_MODEL"] = "oom-batch=4096"
    db = fresh("oom-live.db")
    model = "tiny" if CPU else "resnet18"
    # the batch trained, one that does not fit, one that does, the data set's size (at least the batch that does not
    # fit); --cpu: the OOM hook refuses 4096 and up, and smaller figures keep the tiny model's steps short
    batch, big, fits, size = (32, 8192, 64, 8192) if CPU else (128, 65536, 256, 65536)
    job = subprocess.Popen(DDPTOP + ["--headless", "--local", "1", *backend(), "--model", model, "--batch-size",
                                     str(batch), "--steps", "100000", "--synthetic-size", str(size), "--no-eval",
                                     "--log-every", "20", "--record", db], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)

    def ctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(DDPTOP + ["ctl", *args], capture_output=True, text=True, env=env, timeout=300)

    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if CPU:  # the recording's rows, not a `ctl` process a second (~0.7 CPU-s each) while the job starts
                if job.poll() is not None or recorded_step(db) >= 20:
                    break
                time.sleep(0.2)
                continue
            status = ctl("status", "--json")
            if status.returncode == 0 and json.loads(status.stdout)["step"] >= 20:
                break
            time.sleep(1)
        refused = ctl("set", f"batch_size={big}")
        check("ctl set of a batch that does not fit",
              refused.returncode == 1 and "rolled back at step" in refused.stderr, refused.stderr.strip())
        after = json.loads(ctl("status", "--json").stdout)
        check("the job keeps the previous batch", after["config"]["batch_size"] == batch, f"status {after['config']}")
        fits_set = ctl("set", f"batch_size={fits}")
        check("a batch that fits is applied after the trial step", fits_set.returncode == 0, fits_set.stdout.strip())
        if CPU:  # the job trains on: a step at that batch recorded (the recorder commits about once a second)
            while fits_set.returncode == 0 and time.monotonic() < deadline and job.poll() is None and \
                    recorded_step(db, fits) < 0:
                time.sleep(0.2)
        else:
            time.sleep(10)  # on a GPU: NVML samples (every 0.5 s) well after the roll-back
        ctl("stop")
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            out, err = job.communicate()
    (OUT / "oom-live.log").write_text(out + "\n--- stderr\n" + err)
    check("the job trains on and ends cleanly", job.returncode == 0 and "does not fit" in out,
          [line for line in out.splitlines() if "does not fit" in line])
    if not CPU and job.returncode == 0:
        mem = rows(db, "SELECT t, gpus FROM system WHERE rank = 0 AND gpu_status = 'ok' ORDER BY t")
        rolled = events(db, "out_of_memory")
        proc = [(t, json.loads(g)[0][12]) for t, g in mem if json.loads(g)]
        if rolled and proc:
            when = rolled[0]["t"]
            before = max((p for t, p in proc if t < when and p), default=0)
            later = [p for t, p in proc if when + 2 < t and p]
            check("memory handed back after the roll-back", bool(later) and min(later) < before * 1.5,
                  f"process GPU memory before {before / 2**30:.2f} GiB, after {min(later, default=0) / 2**30:.2f} GiB")


def recorded_step(db: str, batch: int = 0) -> int:
    """The newest step of rank 0 the recording holds (at `batch` per rank, if given), -1 for none or no file yet."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
    except sqlite3.Error:  # not made yet
        return -1
    try:
        (step,) = conn.execute("SELECT max(step) FROM steps WHERE rank = 0 AND (? = 0 OR batch_size = ?)",
                               (batch, batch)).fetchone()
    except sqlite3.Error:  # its tables not made yet
        return -1
    finally:
        conn.close()
    return -1 if step is None else step


def check_q1_profile() -> None:
    db = fresh("q1.db")
    env = {"DDPTOP_TEST_MODEL": "oom-batch=2048"} if CPU else {}
    args = ["--backend", "gloo", "--model", "tiny", "--synthetic-size", "4096"] if CPU else []
    run = ddptop("--headless", "--profile", "hpml-lab4-q1", *args, "--record", db, env=env, log="q1")
    lines = run.stdout.splitlines()
    stop = [line for line in lines if "does not fit" in line]
    check("hpml-lab4-q1 stops at the first batch that does not fit", run.returncode == 0 and bool(stop), stop)
    table = lines[lines.index("segments:"):] if "segments:" in lines else []
    print("\n".join(table[:10]))


# ---- sharded ------------------------------------------------------------------------------------------------------

SHARDED_SWEEP = ("ddp", "zero3", "zero1", "zero2", "single", "ddp")  # single trains apart: not last


def check_sharded() -> None:
    """Issue 43 on the device: every strategy switch of a sweep lands on one step with one fingerprint on every rank;
    each sharded segment's memory by kind is torch's size of the model as the strategy divides it."""
    from ddptop.examples.wide_mlp import mlp  # imports torch: only here, the runs are subprocesses

    world = 2 if CPU else 1
    profile = OUT / "sharded.toml"
    configs = ",\n  ".join(f'{{ strategy = "{s}" }}' for s in SHARDED_SWEEP)
    profile.write_text('[run]\nmodel = "ddptop.examples.wide_mlp:mlp"\nbatch_size = 32\nsynthetic_size = 2400\n'
                       f'seed = 3\nno_eval = true\n\n[sweep]\nwarmup = 2\nmeasure = 3\nconfigs = [\n  {configs},\n]\n')
    db = fresh("sharded.db")
    run = ddptop("--headless", "--profile", str(profile), "--local", str(world), *backend(), "--record", db,
                 log="sharded")
    if not check("sharded sweep", run.returncode == 0, run.stderr.strip().splitlines()[-1:]):
        return
    applied = events(db, "config_applied")
    by_segment: dict[int, list[dict]] = {}
    for e in applied:
        by_segment.setdefault(e["segment"], []).append(e)
    landed = [(seg, {e["step"] for e in es}, {e["fingerprint"] for e in es}, es[0]["config"]["strategy"])
              for seg, es in sorted(by_segment.items())]
    check("every switch on one step, one fingerprint",
          [s for *_, s in landed][-len(SHARDED_SWEEP):] == list(SHARDED_SWEEP)
          and all(len(steps) == 1 and len(prints) == 1 and len(es) == world
                  for (seg, steps, prints, _), es in zip(landed, [by_segment[k] for k in sorted(by_segment)])),
          f"{[(seg, sorted(steps), strategy) for seg, steps, _, strategy in landed]}")
    prints = {e["fingerprint"] for e in events(db, "run_finished")}
    check("one final fingerprint", len(prints) == 1, f"{len(prints)} distinct over {world} ranks")
    size = sum(p.numel() * p.element_size() for p in mlp().parameters())
    strategy_of = {seg: strategy for seg, _, _, strategy in landed}
    samples = rows(db, "SELECT segment, rank, param_bytes, grad_bytes, optim_bytes, peak_bytes, reserved_bytes, by "
                       "FROM memory ORDER BY seq")
    by = {b for *_, b in samples}
    off, seen, momentum = [], {}, {}
    for seg, rank, params, grads, optim, peak, reserved, _ in samples:
        momentum.setdefault((seg, rank), []).append(optim)
        strategy = strategy_of.get(seg)
        if strategy is None:
            continue
        # what the rank holds: zero3 and zero2 shard parameters, gradients and momentum (FSDP2, dim 0, padded to
        # the world size); zero1 the momentum only (whole parameters per rank: at most the model, at least none)
        share = size / world
        want = {"zero3": (share, share, share), "zero2": (share, share, share)}.get(strategy, (size, size, size))
        got = (params, grads, optim)
        ok_kinds = (all(abs(g - w) <= 0.02 * size for g, w in zip(got, want)) if strategy != "zero1"
                    else params == size and grads == size and 0 <= optim <= size)
        ok_peak = params + grads + optim <= peak and (CPU or peak <= reserved)
        seen.setdefault(strategy, set()).add((round(params / 1e6, 2), round(grads / 1e6, 2), round(optim / 1e6, 2)))
        if not (ok_kinds and ok_peak):
            off.append((strategy, rank, got, peak, reserved))
    # zero1: the ranks' momentum shares add up to the model's (ZeroRedundancyOptimizer partitions whole parameters)
    zero1 = [seg for seg, strategy in strategy_of.items() if strategy == "zero1"]
    shares = [sum(momentum[(seg, r)][-1] for r in range(world) if (seg, r) in momentum) for seg in zero1]
    check("zero1 momentum shares add up to the model", bool(shares) and all(s == size for s in shares),
          f"{shares} B against {size} B")
    check("memory by kind per strategy", bool(samples) and set(seen) == set(SHARDED_SWEEP) and not off
          and by == {"process USS" if CPU else "cuda allocator"},
          f"{world} rank(s), model {size / 1e6:.2f} MB; held (params, grads, optim MB) {dict(sorted(seen.items()))}; "
          f"by {sorted(by)}; outside: {off[:3]}")
    if CPU:
        return
    db = fresh("gloo-cuda-zero1.db")  # several ranks on one GPU: gloo only (nccl refuses two ranks on one device)
    run = ddptop("--headless", "--local", "2", "--backend", "gloo", "--device", "cuda", "--model",
                 "ddptop.examples.wide_mlp:mlp", "--strategy", "zero1", "--steps", "12", "--no-eval", "--record", db,
                 log="gloo-cuda-zero1")
    prints = {e["fingerprint"] for e in events(db, "run_finished")} if run.returncode == 0 else set()
    check("2 ranks, gloo on CUDA tensors, zero1", run.returncode == 0 and len(prints) == 1,
          run.stderr.strip().splitlines()[-1:])


# ---- bench --------------------------------------------------------------------------------------------------------

def plain_loop(model_name: str, batch: int, steps: int, warmup: int) -> float:
    """Plain torch on one GPU, what a course script does: the same data and model, pinned batches, SGD; the loss
    printed every 20 steps. Returns wall seconds per step over the steps after `warmup`."""
    import torch
    from torch import nn

    from ddptop.config import RunConfig
    from ddptop.train.data import build_datasets, make_loader
    from ddptop.train.devices import loader_workers
    from ddptop.train.models import build_model

    device = torch.device("cuda", 0) if not CPU else torch.device("cpu")
    torch.manual_seed(0)
    model = build_model(model_name).to(device)
    train, _ = build_datasets(RunConfig(model=model_name))
    loader, sampler = make_loader(train, batch, 0, 1, 0, True, workers=loader_workers(-1, device.type, 1),
                                  pin=device.type == "cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    criterion = nn.CrossEntropyLoss()
    done, epoch, began = 0, 0, 0.0
    while done < steps:
        sampler.set_epoch(epoch)
        for inputs, labels in loader:
            if done == warmup:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                began = time.perf_counter()
            inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(inputs), labels)
            loss.backward()
            optimizer.step()
            done += 1
            if done % 20 == 0:
                print(f"step {done} loss {loss.item():.4f}", file=sys.stderr)
            if done == steps:
                break
        epoch += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - began) / (steps - warmup)


def ddptop_wall(model: str, probes: str, batch: int, steps: int, warmup: int) -> float:
    db = fresh(f"bench-{model}-{probes}.db")
    # --strategy single: at world size 1 it syncs nothing, as the plain loop does (the default, DDP, adds its
    # wrapper and a one-rank all-reduce per bucket: step_overhead_ab.py --device cuda compares it with plain DDP)
    run = ddptop("--headless", "--local", "1", *backend(), "--model", model, "--strategy", "single", "--batch-size",
                 str(batch), "--steps", str(steps), "--probes", probes, "--no-eval", "--log-every", "100", "--record",
                 db,
                 log=f"bench-{model}-{probes}")
    if run.returncode != 0:
        raise RuntimeError(run.stderr.strip().splitlines()[-1:])
    (t0,), (t1,) = rows(db, f"SELECT t FROM steps WHERE rank = 0 AND step IN ({warmup - 1}, {steps - 1}) ORDER BY step")
    return (t1 - t0) / (steps - warmup)


def check_bench(rounds: int, steps: int, models: list[str]) -> None:
    warmup = 50
    for model in models:
        times: dict[str, list[float]] = {"plain": [], "off": [], "all": []}
        for _ in range(rounds):  # interleaved: drift and heat hit every mode alike
            plain = subprocess.run([sys.executable, __file__, "plain", model, str(steps), str(warmup)]
                                   + (["--cpu"] if CPU else []), capture_output=True, text=True, timeout=540)
            times["plain"].append(float(plain.stdout.strip().splitlines()[-1]))
            for probes in ("off", "all"):
                times[probes].append(ddptop_wall(model, probes, 64, steps, warmup))
        med = {mode: statistics.median(v) for mode, v in times.items()}
        print(f"| {model} | {med['plain'] * 1e3:.2f} | {med['off'] * 1e3:.2f} | {med['all'] * 1e3:.2f} | "
              f"{med['off'] / med['plain']:.3f}x | {med['all'] / med['plain']:.3f}x | {med['all'] / med['off']:.3f}x |")
        print("  every round (ms): " + "; ".join(f"{m} {', '.join(f'{t * 1e3:.2f}' for t in v)}"
                                               for m, v in times.items()))
        check(f"{model}: --probes all within 1% of off", med["all"] / med["off"] <= 1.01,
              f"{med['all'] / med['off']:.4f}x (median of {rounds} interleaved runs, {steps - warmup} steps each)")


def main() -> int:
    global CPU
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("cuda", "oom", "sharded", "bench", "plain"))
    p.add_argument("rest", nargs="*")
    p.add_argument("--cpu", action="store_true", help="dry run on a machine without a GPU")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--models", default="vgg11,resnet18")
    args = p.parse_args()
    CPU = args.cpu
    OUT.mkdir(parents=True, exist_ok=True)
    if args.what == "plain":
        model, steps, warmup = args.rest
        print(plain_loop(model, 64, int(steps), int(warmup)))
        return 0
    if not CPU and gpu_count() == 0:
        print("FAIL no CUDA device: run this on the GPU machine (or --cpu for a dry run)")
        return 1
    {"cuda": check_cuda, "oom": check_oom, "sharded": check_sharded,
     "bench": lambda: check_bench(args.rounds, args.steps, args.models.split(","))}[args.what]()
    print(f"{len(FAILED)} failed: {', '.join(FAILED) or 'none'}")
    return len(FAILED)


if __name__ == "__main__":
    sys.exit(main())
