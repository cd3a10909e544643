"""Pure pieces: interval math, wire formulas, the event codec, config checks, rendezvous, handshake, printing."""

from __future__ import annotations

import io

import pytest

from ddptop import metrics
from ddptop.config import RunConfig, SyncConfig
from ddptop.train.join import mismatch
from ddptop.errors import UsageError
from ddptop.events import (EpochDone, EventDecodeError, GpuStat, NicStat, RankLost, RunStarted, Span, StepDone,
                           StepSpans, SystemSample, decode_events, encode_events, event_from_dict)
from ddptop.front.headless import HeadlessPrinter, evaluation_line, progress_line, traffic_lines
from ddptop.metrics import wire
from ddptop.metrics.timeline import breakdown, difference, intersection, length, union
from ddptop.rendezvous import first_slurm_host, resolve


def test_interval_union_and_intersection():
    assert union([(3, 4), (0, 1), (0.5, 2)]) == [(0, 2), (3, 4)]
    assert length([(0, 1), (0.5, 2), (5, 5)]) == 2
    assert intersection([(0, 2), (3, 6)], [(1, 4)]) == [(1, 2), (3, 4)]


def test_breakdown_follows_hta_overlap():
    compute = [(0, 4)]
    comm = [(3, 5), (6, 7)]  # 3 s of comm, 1 s of it under compute
    compute_s, comm_s, exposed_s, overlap = breakdown(compute, comm)
    assert (compute_s, comm_s, exposed_s) == (4, 3, 2)
    assert overlap == pytest.approx(1 / 3)
    assert breakdown(compute, []) == (4, 0, 0, 0.0)


def test_a_collective_that_stops_the_computing_thread_is_exposed_inside_a_compute_phase():
    """FSDP2's all-gather on a CPU runs inside the forward phase on the training thread: no compute beside it."""
    assert difference([(0, 4), (6, 9)], [(1, 2), (3, 7), (8, 8.5)]) == [(0, 1), (2, 3), (7, 8), (8.5, 9)]
    forward, gather, bucket = (0, 10), (2, 5), (9, 12)  # the bucket: asynchronous, beside the forward's end
    compute_s, comm_s, exposed_s, overlap = breakdown([forward], [gather, bucket], blocking=[gather])
    assert (compute_s, comm_s, exposed_s) == (7, 6, 5) and overlap == pytest.approx(1 / 6)
    assert breakdown([forward], [gather, bucket])[2] == 2  # not blocking: 3 s hidden behind the phase


def test_wire_formulas():
    assert wire.ring_allreduce(1000, 4) == (1500, 1500)  # 2(N-1)/N S
    assert wire.ring_allreduce(1000, 1) == (0, 0)
    assert wire.gather(1000, 4, True) == (0, 3000) and wire.gather(1000, 4, False) == (1000, 0)
    assert wire.scatter(1000, 4, True) == (3000, 0) and wire.scatter(1000, 4, False) == (0, 1000)


def _samples():
    nic = NicStat("lo", 1.5, 2.5, 10, 20, 1, 2, 0, 0, 0, 0, 3.0, 4.0)
    gpu = GpuStat(0, "H100", None, 1, 2, None, 40.0)
    return [
        StepDone(0, 3, 0, 1, 1.0, 0.5, 0.01, 0.3, 0.2, 0.1, 0.5, 64, 2.3, 100, 150, 150, True),
        StepSpans(1, 3, 1, 1.0, (Span("fwd", "features.0", 0.0, 0.1), Span("comm", "bucket 0", 0.1, 0.2, 8, 4, 4))),
        SystemSample(0, "node0", 1.0, 10.0, 20.0, 1, 2, 3, "lo", (nic,), (gpu,), "ok"),
        RunStarted("tiny", "synthetic", 2, "ddp", 25.0, False, 64, 0.1, 10, 40, 2, (("features.0", 10),), 5, 1.0),
        EpochDone(0, 0, 10, 2.0, 5, 10, 1.0),
    ]


def test_every_event_round_trips_through_json():
    events = _samples()
    assert decode_events(encode_events(events)) == events


@pytest.mark.parametrize("blob", [b"", b"{", b"{}", b"[1]", b'[{"kind": "nope", "v": 1}]',
                                  b'[{"kind": "epoch_done", "v": 99}]', b'[{"kind": "epoch_done", "v": 1}]'])
def test_bad_event_batches_are_refused(blob):
    with pytest.raises(EventDecodeError):
        decode_events(blob)


def test_unknown_fields_are_ignored():
    data = _samples()[4].to_dict()
    data["from_the_future"] = 1
    assert event_from_dict(data) == _samples()[4]


@pytest.mark.parametrize("changes,word", [
    ({"strategy": "ring"}, "strategy"), ({"batch_size": 0}, "batch size"), ({"batch_size": 2.5}, "batch size"),
    ({"bucket_mb": 0}, "bucket"), ({"bucket_mb": float("nan")}, "bucket"), ({"lr": -1}, "learning rate"),
    ({"async_op": "yes"}, "async_op"),
])
def test_sync_config_is_checked(changes, word):
    with pytest.raises(UsageError, match=word):
        SyncConfig(**changes)


def test_run_config_round_trips_and_checks():
    cfg = RunConfig(model="tiny", sync=SyncConfig(strategy="allreduce", async_op=True))
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(UsageError):
        RunConfig(epochs=0, steps=0)
    with pytest.raises(UsageError):
        RunConfig(span_every=-1)  # 0: the default cadence (metrics.span_cadence)


def test_slurm_nodelist_first_host():
    assert first_slurm_host("node[03-05,7],gpu1") == "node03"
    assert first_slurm_host("gpu1,gpu2") == "gpu1"
    assert first_slurm_host("single") == "single"


def test_rendezvous_sources_in_order():
    torchrun = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h0",
                "MASTER_PORT": "29500", "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2"}
    slurm = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODELIST": "n[1-2]",
             "SLURM_JOB_ID": "123456", "SLURM_NTASKS_PER_NODE": "2(x2)"}
    r = resolve(None, None, None, None, None, torchrun)
    assert (r.source, r.rank, r.world_size, r.master, r.port, r.agent_store, r.attempt) == \
        ("torchrun", 1, 4, "h0", 29500, True, 2)
    r = resolve(None, None, None, None, None, slurm)
    assert (r.source, r.rank, r.world_size, r.master, r.port, r.local_world_size) == ("slurm", 3, 4, "n1", 18456, 2)
    r = resolve("10.10.1.1", None, 2, 4, None, torchrun)  # flags win
    assert (r.source, r.rank, r.master) == ("flags", 2, "10.10.1.1")
    r = resolve(None, None, None, None, None, {})
    assert (r.source, r.world_size) == ("local", 2)
    with pytest.raises(UsageError):
        resolve(None, None, None, None, None, {**slurm, "SLURM_NTASKS": "four"})


def test_handshake_names_the_first_mismatch():
    base = {"rank": 0, "world_size": 2, "ddptop_version": "0.1.0", "protocol": 1, "torch_version": "2.9",
            "run_config": {"model": "tiny"}}
    assert mismatch([base, {**base, "rank": 1}]) is None
    assert mismatch([base, {**base, "rank": 1, "world_size": 3}]) == "rank 1 has world size 3, rank 0 has 2"
    assert "ddptop version 0.2.0" in mismatch([base, {**base, "rank": 1, "ddptop_version": "0.2.0"}])
    assert "run configuration" in mismatch([base, {**base, "rank": 1, "run_config": {"model": "vgg11"}}])


def test_printed_lines_match_the_course_formats():
    done = _samples()[0]
    job = metrics.Figures(steps=1, step_s=0.6, images_per_s=197.4)
    line = progress_line(20, 196, done.loss, metrics.window([done]), job, 2, 1)
    assert line.startswith("step 20/196 loss 2.3000 (rank 0) | job: 0.600 s/it 197 img/s (segment 1, 2 ranks)")
    assert "rank 0: comm 40% overlap 50% exposed 100 ms sent 0.0 MB/step" in line
    assert evaluation_line(EpochDone(0, 0, 196, 2.0345, 2292, 10000, 0.0)) == \
        "Test set: Average loss: 2.0345, Accuracy: 2292/10000 (23%)"
    out = io.StringIO()
    printer = HeadlessPrinter(total_steps=4, every=2, out=out)
    printer.handle([StepDone(0, s, 0, 0, 0.0, 0.1, 0, 0, 0, 0, 0, 8, 1.0, 0, 0, 0, False) for s in range(4)])
    assert [line.split(" loss")[0] for line in out.getvalue().splitlines()] == ["step 1/4", "step 2/4", "step 4/4"]


def test_a_lost_rank_is_named_by_the_step_number_the_progress_lines_use():
    """Steps 0..4 print as `step 5/10`: a rank lost after its step 4 was lost after step 5 in those words."""
    out = io.StringIO()
    printer = HeadlessPrinter(total_steps=10, every=5, out=out, bar=False)
    printer.handle([StepDone(r, s, 0, 0, float(s), 0.1, 0, 0, 0, 0, 0, 8, 1.0, 0, 0, 0, False)
                    for s in range(5) for r in (0, 1)])
    printer.handle([RankLost(1, 5, "process 123 killed by signal 9", 5.5)])
    lines = out.getvalue().splitlines()
    assert lines[-2].startswith("step 5/10 loss")
    assert lines[-1] == "rank 1 lost after step 5: process 123 killed by signal 9"


def test_telemetry_bytes_are_allowed_once_per_step_counted():
    """A small model's job: 10 kB per step by the formulas, 40 kB more of telemetry and headers on the NIC each
    step. Over 18 steps that is within TELEMETRY_BYTES per step, not someone else's traffic."""
    per_step, extra, n = 10_000, 40_000, 20
    events = []
    for k in range(n):
        events.append(StepDone(0, k, 0, 0, k + 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 8, 1.0, per_step, per_step,
                               per_step, False, fwd_s=0.3, bwd_s=0.7))
    for i in range(2 * n):
        t = 0.1 + 0.5 * i  # every other sample falls in a forward pass: whole steps between them
        moved = int(t) * (per_step + extra) + (per_step + extra if t % 1 > 0.3 else 0)
        nic = NicStat("eth0", 0.0, 0.0, moved, moved, 0, 0, 0, 0, 0, 0, 0.0, 0.0)
        events.append(SystemSample(rank=0, host="node0", t=t, proc_cpu_percent=1.0, node_cpu_percent=1.0,
                                   proc_rss_bytes=1, node_mem_used_bytes=1, node_mem_total_bytes=2,
                                   job_iface="eth0", nics=(nic,)))
    printer = HeadlessPrinter(out=io.StringIO(), bar=False)
    printer.handle(sorted(events, key=lambda e: e.t))
    snap = printer.state.snapshot()
    assert snap.traffic(0).steps > 10
    assert traffic_lines(snap) == [snap.traffic(0).describe()]


def test_scaling_is_throughput_over_the_smallest_world_size():
    from ddptop.report.analysis import SegmentStats, scaling

    def seg(world, ips, strategy="ddp"):
        return SegmentStats("", 0, SyncConfig(strategy=strategy), world, 0, 10, 1.0, 1.0, ips, 0, 0, 0, 0, 0, 0,
                            None, None, None, None, 0.0, None)

    rows = scaling([seg(1, 100.0), seg(2, 180.0), seg(4, 300.0), seg(2, 50.0, "allreduce")])
    assert [(r.world_size, round(r.speedup, 2), round(r.efficiency, 2)) for r in rows] == \
        [(1, 1.0, 1.0), (2, 1.8, 0.9), (4, 3.0, 0.75)]
