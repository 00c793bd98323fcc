"""Overlap, compression and the link hint of tfrun's exchange across hosts, as pure units:
buckets, the exchange thread's order and errors, 16-bit rounding and error feedback, when
the exchange binds (real groups: test_tcp_allreduce.py; real runs: tests/multihost)."""

import threading
import time

import numpy as np
import pytest

from tfrun.comm import CommOptions
from tfrun.errors import ConfigError
from tfrun.in_task.exchange import compression, link_watch, overlap

pytestmark = pytest.mark.quick


def _sized(*specs):
    return [(name, (dtype, nbytes)) for name, dtype, nbytes in specs]


def test_buckets_keep_the_order_close_at_the_target_and_at_a_dtype_change():
    items = _sized(("bias2", "float32", 40), ("kernel2", "float32", 40_960),
                   ("bias1", "float32", 4096), ("kernel1", "float32", 4 << 20),
                   ("bias0", "float32", 4096), ("kernel0", "float32", 3 << 20),
                   ("steps", "int64", 8), ("scale", "float32", 4))
    cut = overlap.buckets(items, 2 << 20)
    assert [[name for name, _ in b] for b in cut] == [
        ["bias2", "kernel2", "bias1", "kernel1"], ["bias0", "kernel0"], ["steps"], ["scale"]]
    assert overlap.buckets(items[:6], 64 << 20) == [items[:6]]  # one bucket: all at the end
    assert overlap.buckets([], 1) == []


def test_the_exchange_thread_runs_collectives_in_the_order_started_and_hands_back_errors():
    exchanges = overlap.Exchanges()
    ran, release = [], threading.Event()

    def slow(arrays):
        release.wait(5)
        ran.append(("slow", arrays))
        return "slow"

    def fast(arrays):
        ran.append(("fast", arrays))
        return "fast"

    def failing(arrays):
        raise ConnectionError("worker:1 left")

    tickets = [exchanges.start(slow, 1), exchanges.start(fast, 2), exchanges.start(failing, 3)]
    assert ran == []  # started, not waited for: the caller goes on
    release.set()
    assert exchanges.finish(tickets[1]) == "fast"  # waits for the slow one first
    assert ran == [("slow", 1), ("fast", 2)]
    assert exchanges.finish(tickets[0]) == "slow"
    with pytest.raises(ConnectionError, match="worker:1 left"):
        exchanges.finish(tickets[2])
    assert exchanges.run(fast, 4) == "fast"
    exchanges.close()


def test_only_the_wait_in_finish_counts_not_the_transfer_beside_the_step():
    exchanges = overlap.Exchanges()
    ticket = exchanges.start(lambda arrays: time.sleep(0.3), None)
    time.sleep(0.4)  # the step's own work, while the transfer runs
    exchanges.finish(ticket)
    assert exchanges.waited_seconds < 0.1
    exchanges.run(lambda arrays: time.sleep(0.2), None)
    assert exchanges.waited_seconds >= 0.2
    exchanges.close()


def _values(n=100_000, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=n) * 10.0 ** rng.integers(-10, 10, n)).astype(np.float32)
    return np.concatenate([x, np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, 65504,
                                        65520, 1e-8, 1.00390625], np.float32)])


@pytest.mark.parametrize("wire", compression.WIRES)
def test_numpys_16_bit_casts_give_tensorflows_bits(wire, monkeypatch):
    tf = pytest.importorskip("tensorflow")
    x = _values()
    with_tf = compression.down(x, wire)
    assert compression._tensorflow() is tf
    monkeypatch.setattr(compression, "_tensorflow", lambda: None)
    with np.errstate(over="ignore"):
        with_numpy = compression.down(x, wire)
    assert np.array_equal(with_numpy, with_tf)
    assert np.array_equal(compression.up(with_numpy, wire),
                          tf.cast(tf.bitcast(tf.constant(with_tf), compression.DTYPES[wire]),
                                  tf.float32).numpy(), equal_nan=True)


@pytest.mark.parametrize("wire", compression.WIRES)
def test_error_feedback_loses_no_gradient_only_delays_it(wire, monkeypatch):
    """A small gradient added to a large one each step: rounding alone drops it every
    time; with feedback the rounded values sent add up to the exact sum within one
    rounding error."""
    monkeypatch.setattr(compression, "_tensorflow", lambda: None)
    feedback = compression.ErrorFeedback()
    gradient = np.full(4, 1.0, np.float32) + np.float32(2e-4)  # under half of both wires' step
    sent_with = np.zeros(4, np.float64)
    sent_without = np.zeros(4, np.float64)
    for _ in range(1000):
        sent_with += compression.up(feedback.apply("bucket", gradient, wire), wire)
        sent_without += compression.up(compression.down(gradient, wire), wire)
    exact = 1000 * gradient.astype(np.float64)
    assert np.abs(sent_without - exact).max() == pytest.approx(0.2, rel=1e-3)  # all lost
    assert np.abs(sent_with - exact).max() < 1e-2
    # a bucket of another shape (a retraced step) starts afresh rather than failing
    assert feedback.apply("bucket", np.ones(3, np.float32), wire).shape == (3,)


def test_the_hint_says_the_share_the_link_and_the_flag_that_helps():
    said = link_watch.hint(0.46, 238.4, "none", link_share=0.45)
    assert said.startswith("exchange: 46% of each step waits for the exchange over a 2.0 "
                           "Gbit/s link (the bytes a worker sends take 45% of the time there)")
    assert said.endswith("; --comm compress=bf16 halves its bytes")
    assert "already fp16 on the wire" in link_watch.hint(0.5, 238.4, "fp16", link_share=0.4)
    # a third or less: it does not bind, whatever the link
    assert link_watch.hint(1 / 3, 238.4, "none", link_share=0.33) is None
    # waits a lot, but its bytes take 2% of the time on the link: the exchange's
    # per-message cost or a slower peer, which compression would not help
    assert link_watch.hint(0.34, 3400.0, "none", link_share=0.02) is None


class _Waits:
    waited_seconds = 0.0


def _watch(monkeypatch, share, sent_bytes=7.4e6, speaker=True):
    """A LinkWatch fed 80 exchanges 50 ms apart, ``share`` of which waited on the exchange,
    each sending ``sent_bytes`` over a 2 Gbit/s link (7.1 MiB: 30 ms, 59% of the time)."""
    clock = [100.0]
    monkeypatch.setattr(link_watch.time, "perf_counter", lambda: clock[0])
    recorded = []
    monkeypatch.setattr("tfrun.in_task.measure.record_lines.record_training_event",
                        lambda event, **fields: recorded.append((event, fields)))
    waits, watch = _Waits(), link_watch.LinkWatch()
    watch.begin(238.4, "none", waits, speaker=speaker)
    for _ in range(80):
        watch.round_started(sent_bytes)
        clock[0] += 0.05
        waits.waited_seconds += 0.05 * share
    return watch, recorded


def test_the_watch_measures_after_warm_up_and_records_it_once(monkeypatch):
    watch, recorded = _watch(monkeypatch, 0.5)
    assert watch.measured["share"] == pytest.approx(0.5) and watch.measured["binds"]
    assert watch.measured["link_share"] == pytest.approx(7.4e6 / (238.4 * 2 ** 20) / 0.05, rel=1e-2)
    assert 2.0 <= watch.measured["seconds"] <= 2.06  # 2 s after the 5 warm-up exchanges
    assert [event for event, _ in recorded] == ["exchange_measured"]
    assert recorded[0][1]["hint"].startswith("exchange: 50% of each step")
    watch, recorded = _watch(monkeypatch, 0.1)  # overlap hid most of it
    assert not watch.measured["binds"] and watch.measured["hint"] is None
    assert recorded[0][1]["binds"] is False
    watch, recorded = _watch(monkeypatch, 0.5, sent_bytes=1e4)  # waits, but not for the link
    assert not watch.measured["binds"] and recorded[0][1]["hint"] is None
    watch, recorded = _watch(monkeypatch, 0.5, speaker=False)  # not rank 0: measured, silent
    assert watch.measured["binds"] and recorded == []


def test_comm_options_for_feedback_and_overlap():
    options = CommOptions.parse("compress=bf16,feedback,overlap=off")
    assert (options.compression, options.feedback, options.overlap) == ("bf16", True, False)
    assert CommOptions.parse(options.to_text()) == options
    assert CommOptions.parse("auto").overlap is None  # auto: by where the workers are
    for text in ("overlap=on", "overlap=auto", "shm,overlap=on"):
        assert CommOptions.parse(CommOptions.parse(text).to_text()) == CommOptions.parse(text)
    with pytest.raises(ConfigError, match="nothing is compressed"):
        CommOptions.parse("feedback")
    with pytest.raises(ConfigError, match="not understood"):
        CommOptions.parse("overlap=sometimes")


@pytest.mark.parametrize("comm, hosts, overlaps", [
    ("auto", ("a", "b"), True), ("auto,overlap=off", ("a", "b"), False),
    ("auto", ("a", "a"), False), ("auto,overlap=on", ("a", "a"), True),
    ("shm,compress=bf16", ("a", "a"), False),
])
def test_overlap_by_default_across_hosts_and_not_on_one(comm, hosts, overlaps):
    """On one host the native op inside the step measured faster than buckets on the
    exchange thread (benchmarks.md): overlap there only when asked."""
    import json

    from tfrun.in_task.exchange import shm_allreduce, tcp_allreduce

    env = {"TF_CONFIG": json.dumps({"cluster": {"worker": [f"{h}:{1 + i}" for i, h in enumerate(hosts)]},
                                    "task": {"type": "worker", "index": 0}}),
           "TFRUN_RUN_DIR": "/r", "TFRUN_COMM": comm}
    plan = shm_allreduce.plan_from_env(env) or tcp_allreduce.plan_from_env(env)
    assert isinstance(plan, shm_allreduce.ShmPlan) == (hosts[0] == hosts[1])
    assert plan.overlap is overlaps


def _tensor(elements, dtype="float32", known=True):
    """What the exchange reads of a gradient at trace time: its dtype's name and shape."""
    import types

    shape = types.SimpleNamespace(num_elements=lambda: elements if known else None,
                                  is_fully_defined=lambda: known)
    return types.SimpleNamespace(dtype=types.SimpleNamespace(name=dtype, size=4), shape=shape)


def test_how_a_bucket_crosses_is_decided_once_for_both_exchange_paths():
    """``_crossing``: the wire, and whether the step's graph casts to it (a flat TCP group
    without error feedback) or the exchange thread does (feedback, the two-stage group);
    full precision for small buckets, other dtypes and unknown shapes; the bytes sent
    follow the decided wires."""
    from tfrun.in_task.exchange import allreduce
    from tfrun.in_task.exchange.hierarchical_allreduce import HierarchicalPlan
    from tfrun.in_task.exchange.shm_allreduce import ShmPlan
    from tfrun.in_task.exchange.tcp_allreduce import TcpPlan

    def tcp(**kw):
        return TcpPlan(rank=0, names=("worker:0", "worker:1"), hosts=("a", "b"), **kw)

    big = [_tensor(1024), _tensor(10)]
    assert allreduce._crossing(tcp(), big) == (None, None)
    assert allreduce._crossing(tcp(compression="bf16"), big) == ("bf16", "bf16")
    assert allreduce._crossing(tcp(compression="fp16", feedback=True), big) == ("fp16", None)
    two_stage = HierarchicalPlan(rank=0, names=("w0", "w1", "w2", "w3"),
                                 local=ShmPlan(rank=0, names=("w0", "w1"), address="x"),
                                 across=tcp(compression="bf16"))
    assert allreduce._crossing(two_stage, big) == ("bf16", None)
    for small in ([_tensor(127)], [_tensor(1024, "int32")], [_tensor(1024, known=False)]):
        assert allreduce._crossing(tcp(compression="bf16"), small) == (None, None)
    cut = [big, [_tensor(100)]]
    wires = [allreduce._crossing(tcp(compression="bf16"), b)[0] for b in cut]
    # 2 workers: each sends half of every bucket twice (reduce-scatter, all-gather)
    assert allreduce._sent_bytes(tcp(compression="bf16"), cut, wires) == 1034 * 2 + 100 * 4


def test_the_benchmarks_exchange_timings_time_each_bucket_and_the_wait_for_it(monkeypatch):
    """benchmarks/_exchange_timings.py (bench_cross_host.py --exchange-timings): per bucket
    size, the time its collective ran on the exchange's thread and the step waited in
    ``finish``; ``reset`` forgets the warm-up."""
    import sys

    from conftest import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    for name in ("start", "finish"):  # restored after the test: install patches the class
        monkeypatch.setattr(overlap.Exchanges, name, getattr(overlap.Exchanges, name))
    monkeypatch.delitem(sys.modules, "_exchange_timings", raising=False)
    from _exchange_timings import ExchangeTimings

    timings = ExchangeTimings.install()
    exchanges = overlap.Exchanges()
    try:
        warm_up = exchanges.start(lambda arrays: arrays, [np.zeros(1, np.float32)])
        exchanges.finish(warm_up)
        timings.reset()
        for _ in range(2):
            asked = threading.Event()

            def until_asked_and_then_some(arrays, asked=asked):
                asked.wait(5)
                time.sleep(0.2)  # still running well after the step asks for it
                return arrays

            big = exchanges.start(until_asked_and_then_some, [np.zeros(1000, np.float32)])
            small = exchanges.start(lambda arrays: arrays, [np.zeros(2, np.float16)])
            asked.set()
            assert exchanges.finish(big)[0].shape == (1000,)
            exchanges.finish(small)
    finally:
        exchanges.close()
    (first, second) = timings.summary()
    assert (first["bytes"], first["count"], second["bytes"], second["count"]) == (4000, 2, 4, 2)
    assert first["running_ms"] >= 200 and first["waited_ms"] > 0, first
