"""The shared-memory all-reduce (issue 15.3): the pure plan, and real processes exchanging
through real memfds and an abstract Unix socket, with the Python exchange and the native one
(tfrun/_shm_kernel.cc through ctypes). No TensorFlow in these processes: the native library
is built once in a subprocess; the strategy-level tests are in
tests/integration/test_devices_and_comm.py."""

import json
import multiprocessing as mp
import os
import socket
import struct
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from tfrun.in_task.exchange import _native
from tfrun.errors import ConfigError
from tfrun.in_task.exchange.shm_allreduce import ShmGroup, ShmPlan, plan_from_env

CTX = mp.get_context("fork")


def env(cluster, task, **extra):
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task}), "TFRUN_RUN_DIR": "/r",
            **extra}


TWO = {"worker": ["localhost:1", "localhost:2"]}


class TestPlan:
    def test_every_worker_on_one_host(self):
        plan = plan_from_env(env({"chief": ["localhost:3"], **TWO}, {"type": "worker", "index": 0}))
        assert plan.names == ("chief:0", "worker:0", "worker:1") and plan.rank == 1
        assert plan.address.startswith("\0tfrun-shm-")

    def test_same_cluster_same_address_other_run_other_address(self):
        a = plan_from_env(env(TWO, {"type": "worker", "index": 0}))
        b = plan_from_env(env(TWO, {"type": "worker", "index": 1}))
        c = plan_from_env(env(TWO, {"type": "worker", "index": 1}, TFRUN_RUN_DIR="/other"))
        assert a.address == b.address != c.address

    @pytest.mark.parametrize("cluster, task, comm", [
        ({"worker": ["localhost:1"]}, {"type": "worker", "index": 0}, None),          # alone
        ({"worker": ["a:1", "b:2"]}, {"type": "worker", "index": 0}, None),           # two hosts
        ({**TWO, "ps": ["localhost:3"], "chief": ["localhost:4"]},
         {"type": "worker", "index": 0}, None),                                       # PS cluster
        ({**TWO, "evaluator": ["localhost:5"]}, {"type": "evaluator", "index": 0}, None),
        (TWO, {"type": "worker", "index": 0}, "ring"),                                # asked for TF's
        (TWO, {"type": "worker", "index": 0}, "nccl,pack=1MB"),
    ])
    def test_tensorflow_collectives_apply(self, cluster, task, comm):
        extra = {"TFRUN_COMM": comm} if comm else {}
        assert plan_from_env(env(cluster, task, **extra)) is None

    def test_no_cluster_no_plan(self):
        assert plan_from_env({}) is None
        assert plan_from_env({"TF_CONFIG": "not json"}) is None

    def test_explicit_shm_across_hosts_is_a_clear_error(self):
        with pytest.raises(ConfigError) as error:
            plan_from_env(env({"worker": ["a:1", "b:2"]}, {"type": "worker", "index": 0},
                              TFRUN_COMM="shm"))
        assert "one host" in str(error.value) and "a, b" in str(error.value)


def _plans(size, **fields):
    address = f"\0tfrun-shm-test-{uuid.uuid4().hex}"
    names = tuple(f"worker:{i}" for i in range(size))
    return [ShmPlan(rank=r, names=names, address=address, **fields) for r in range(size)]


@pytest.fixture(scope="module")
def native_library(tmp_path_factory):
    """The native exchange, built the way a task builds it (TensorFlow's headers and
    flags), in a subprocess so that this process and its forks never load TensorFlow."""
    cache = tmp_path_factory.mktemp("kernel-cache")
    build = subprocess.run([sys.executable, "-c", "from tfrun.in_task.exchange._native import library_path; "
                            "print(library_path())"], capture_output=True, text=True,
                           env={**os.environ, "TFRUN_CACHE_DIR": str(cache),
                                "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    return build.stdout.strip().splitlines()[-1]


@pytest.fixture(params=["python", "native"])
def exchange(request):
    """None for the Python exchange, else the native library's path."""
    return request.getfixturevalue("native_library") if request.param == "native" else None


def _open(plan, native, **kwargs):
    group = ShmGroup(plan, connect_timeout=30, **kwargs)
    if native:
        group.use_native(_native.open_library(native))
    return group


def _member(plan, chunk_bytes, arrays, results, native=None):
    try:
        group = _open(plan, native, chunk_bytes=chunk_bytes)
        out = [group.all_reduce(a(plan.rank)) for a in arrays]
        results.put((plan.rank, [o.tobytes() for o in out], [str(o.dtype) for o in out]))
        group.close()
    except BaseException as exc:  # reported to the test
        results.put((plan.rank, repr(exc), None))


def _run(size, arrays, chunk_bytes=1 << 20, natives=None, member=_member, **plan_fields):
    """Each rank's results; ``natives``: per rank, None (Python) or the native library;
    ``plan_fields``: the plans' ``--comm`` fields."""
    results = CTX.Queue()
    natives = natives or [None] * size
    procs = [CTX.Process(target=member, args=(p, chunk_bytes, arrays, results, native))
             for p, native in zip(_plans(size, **plan_fields), natives)]
    for p in procs:
        p.start()
    got = dict((rank, (out, dtypes)) for rank, out, dtypes in (results.get(timeout=60) for _ in procs))
    for p in procs:
        p.join(30)
    return got


def _floats(dtype, n):
    return lambda rank: (np.random.default_rng(rank).normal(size=n) * 100).astype(dtype)


ARRAYS = [_floats("float32", 1000), _floats("float64", 7), _floats("float16", 3),
          _floats("float32", 0), _floats("float32", 5000)]  # 20 kB: several chunks of 4 kB


@pytest.mark.parametrize("size", [2, 3])
def test_sums_in_rank_order_and_every_task_gets_the_same_bits(size, exchange):
    arrays = ARRAYS
    got = _run(size, arrays, chunk_bytes=4096, natives=[exchange] * size)
    assert sorted(got) == list(range(size))
    for i, make in enumerate(arrays):
        expected = make(0)
        for rank in range(1, size):
            expected = (expected + make(rank)).astype(expected.dtype)  # rank order
        for rank in range(size):
            out, dtypes = got[rank]
            assert isinstance(out, list), out
            assert dtypes[i] == str(expected.dtype)
            assert out[i] == expected.tobytes(), (rank, i)


def test_the_native_and_the_python_exchange_speak_the_same_protocol(native_library):
    """One worker on each: the same bits as all-Python (a task whose build failed still
    meets the others)."""
    mixed = _run(3, ARRAYS, chunk_bytes=4096, natives=[native_library, None, native_library])
    python = _run(3, ARRAYS, chunk_bytes=4096)
    assert all(isinstance(out, list) for out, _ in mixed.values()), mixed
    assert mixed == python


def _compressed_member(plan, chunk_bytes, arrays, results, native=None):
    """Two ``all_reduce_compressed`` of the same float32 arrays, as the exchange thread runs
    a bucket's with ``--comm compress=`` (with feedback, the second adds the first's
    rounding error)."""
    try:
        group = _open(plan, native, chunk_bytes=chunk_bytes)
        out = []
        for _ in range(2):
            out += group.all_reduce_compressed([a(plan.rank) for a in arrays], plan.compression,
                                               key="bucket")
        results.put((plan.rank, [o.tobytes() for o in out], [str(o.dtype) for o in out]))
        group.close()
    except BaseException as exc:  # reported to the test
        results.put((plan.rank, repr(exc), None))


@pytest.mark.parametrize("wire, feedback", [("fp16", False), ("bf16", True)])
def test_a_compressed_all_reduce_gives_the_bits_the_tcp_exchange_gives(wire, feedback, exchange):
    """Each task's values rounded to 16 bits (after the kept error, with feedback), summed
    as float32 in rank order, the sum rounded: what the TCP exchange computes (its test:
    test_tcp_allreduce.py), so a run's numerics do not depend on where its workers are."""
    from tfrun.in_task.exchange.compression import down, up

    def rounded(values):
        return up(down(values, wire), wire)

    arrays = [_floats("float32", n) for n in (1000, 1, 2501)]
    got = _run(3, arrays, chunk_bytes=4096, natives=[exchange] * 3, member=_compressed_member,
               compression=wire, feedback=feedback)
    changed = []
    for i, make in enumerate(arrays):
        first = rounded(sum(rounded(make(r)) for r in range(3)))
        kept = [make(r) - rounded(make(r)) if feedback else 0 for r in range(3)]
        second = rounded(sum(rounded(make(r) + kept[r]) for r in range(3)))
        assert first.dtype == second.dtype == np.float32
        for rank in range(3):
            out, dtypes = got[rank]
            assert isinstance(out, list), out
            assert out[i] == first.tobytes() and out[len(arrays) + i] == second.tobytes(), (rank, i)
        exact = sum(make(r).astype(np.float64) for r in range(3))
        assert 0 < np.abs(first - exact).max() < (1.0 if wire == "fp16" else 8.0)  # rounded
        changed.append(bool((first != second).any()))
    assert any(changed) == feedback, changed  # the kept error went into the second


# The same library's owner sum for the TCP exchange's 16-bit values (``_native.sum_16``).
_EDGES = np.array([0.0, -0.0, 1e-8, -1e-8, 6e-5, 6.1e-5, 65504, 65520, 1e5, -1e5, np.inf,
                   -np.inf, 3e38, -3e38, 1.00390625, 1.5e-45, np.nan], np.float32)


@pytest.mark.parametrize("wire", ["fp16", "bf16"])
@pytest.mark.parametrize("count", [2, 3])
def test_the_native_sum_of_16_bit_values_gives_the_bits_numpy_gives(native_library, wire, count):
    """Widened to float32, summed in rank order, rounded to nearest (ties to even): fp16
    through the F16C conversions 8 at a time (and a scalar tail), bf16 in integers; values
    of every scale, both infinities, overflow, subnormals, NaN; lengths around the 8 and
    the blocks of 2048."""
    from tfrun.in_task.exchange.compression import down, up

    library = _native.open_library(native_library)
    rng = np.random.default_rng(count)
    for n in (0, 1, 7, 8, 9, 2047, 2049, 10001):
        values = [np.concatenate([rng.normal(0, 10.0 ** rng.integers(-6, 5), n).astype(np.float32),
                                  _EDGES]) for _ in range(count)]
        parts = [down(v, wire) for v in values]
        total = up(parts[0], wire)
        with np.errstate(over="ignore", invalid="ignore"):
            for part in parts[1:]:
                total = total + up(part, wire)
        expected = down(total, wire)
        got = _native.sum_16(library, parts, wire)
        assert got.dtype == np.uint16 and got.tobytes() == expected.tobytes(), \
            (n, np.flatnonzero(got != expected)[:5])


def test_the_compressed_exchange_sums_with_the_native_library_when_its_group_has_it(
        native_library, monkeypatch):
    """``sum_on_wire`` hands the owner's parts to ``sum_16`` when the group has the library
    (and to NumPy when not): the same slice goes out either way."""
    from tfrun.in_task.exchange import compression

    parts = [compression.down(_floats("float32", 4001)(r), "fp16") for r in range(3)]

    class Group:
        def __init__(self, native):
            self.native_sums, self.gathered = native, None

        def reduce_scatter(self, arrays, timeout):
            return parts

        def all_gather(self, mine, shapes, timeout):
            self.gathered = mine
            return [mine]

    calls, real = [], _native.sum_16
    monkeypatch.setattr(_native, "sum_16", lambda *a: calls.append(a[2]) or real(*a))
    native, python = Group(_native.open_library(native_library)), Group(None)
    compression.sum_on_wire(native, [parts[0]], "fp16")
    compression.sum_on_wire(python, [parts[0]], "fp16")
    assert calls == ["fp16"]
    assert native.gathered.tobytes() == python.gathered.tobytes()


def _cut_member(plan, chunk_bytes, cuts, results, native=None):
    """Rank r all-reduces the same 5000 floats as every rank, cut at ``cuts[r]``."""
    try:
        group = _open(plan, native, chunk_bytes=chunk_bytes)
        sums = group.all_reduce_many(np.split(_floats("float32", 5000)(plan.rank), cuts[plan.rank]))
        results.put((plan.rank, np.concatenate(sums).tobytes(), [s.size for s in sums]))
        group.close()
    except BaseException as exc:  # reported to the test
        results.put((plan.rank, repr(exc), None))


# Pieces that start and end inside and on the 4 kB chunks (1024 floats), and empty ones.
CUTS = [[0, 1, 1000, 1024, 1024, 3000], [], [17, 2048, 4999]]


@pytest.mark.parametrize("natives", ["native", "mixed", "python"])
def test_a_list_of_arrays_is_exchanged_as_its_concatenation(natives, request):
    """all_reduce_many (the native op's path: a pack of gradients without concat/split):
    every rank gets the rank-order sum of the concatenation, back in its own pieces,
    wherever each rank cut it and whichever exchange it runs."""
    library = request.getfixturevalue("native_library") if natives != "python" else None
    per_rank = {"native": [library] * 3, "mixed": [library, None, library],
                "python": [None] * 3}[natives]
    got = _run(3, CUTS, chunk_bytes=4096, natives=per_rank, member=_cut_member)
    expected = _floats("float32", 5000)(0)
    for rank in (1, 2):
        expected = expected + _floats("float32", 5000)(rank)
    for rank in range(3):
        out, sizes = got[rank]
        assert sizes == [len(piece) for piece in np.split(np.zeros(5000), CUTS[rank])], got[rank]
        assert out == expected.tobytes(), rank


def _mixed_dtypes(plan, results, native=None):
    group = _open(plan, native)
    try:
        group.all_reduce_many([np.ones(2, np.float32), np.ones(2, np.float64)])
        results.put("no error")
    except ValueError as exc:
        results.put(str(exc))


def test_a_list_of_arrays_of_several_dtypes_is_refused(exchange):
    messages, procs = _pair(_mixed_dtypes, reports=2, native=exchange)
    assert messages == ["all_reduce_many takes one or more arrays of one dtype. Received: "
                        "float32, float64"] * 2


def _dies_after_one(plan, results, native=None):
    group = _open(plan, native)
    group.all_reduce(np.ones(4, np.float32))
    if plan.rank == 1:
        os._exit(3)  # no goodbye: the process just ends
    try:
        group.all_reduce(np.ones(4, np.float32))
        results.put("no error")
    except ConnectionError as exc:
        results.put(str(exc))


def _pair(target, reports: int, native=None):
    """Ranks 0 and 1 of a fresh plan run ``target(plan, results, native)``: the first
    ``reports`` messages they put, and the processes (joined)."""
    results = CTX.Queue()
    procs = [CTX.Process(target=target, args=(p, results, native)) for p in _plans(2)]
    for p in procs:
        p.start()
    messages = [results.get(timeout=60) for _ in range(reports)]
    for p in procs:
        p.join(30)
    return messages, procs


def test_a_peer_that_dies_fails_the_others_at_once_with_its_name(exchange):
    [message], procs = _pair(_dies_after_one, reports=1, native=exchange)
    assert "worker:1 left the exchange" in message and "worker:0 stops too" in message
    assert [p.exitcode for p in procs] == [0, 3]


def _late_peer(plan, results, native=None):
    group = _open(plan, native)
    if plan.rank == 1:
        time.sleep(1.5)  # late for rank 0's 0.3 s timeout
        results.put("late")
        return
    try:
        group.all_reduce(np.ones(4, np.float32), timeout=0.3)
        results.put("no error")
    except TimeoutError as exc:
        results.put(str(exc))


def test_an_exchange_that_outlasts_the_timeout_fails_with_it(exchange):
    """The native barrier first spins (a worker per CPU here), then sleeps in poll(): the
    --comm timeout bounds both."""
    messages, procs = _pair(_late_peer, reports=2, native=exchange)
    assert sorted(messages) == ["late", "tfrun shared-memory all-reduce: exchange 1 took longer "
                                        "than the --comm timeout of 0.3 s"], messages


def _mismatched(plan, results, native=None):
    group = _open(plan, native)
    try:
        group.all_reduce(np.ones(4 if plan.rank == 0 else 8, np.float32))
        results.put("no error")
    except RuntimeError as exc:
        results.put(str(exc))


def test_different_all_reduces_on_different_workers_are_an_error_not_a_wrong_sum(exchange):
    messages, _ = _pair(_mismatched, reports=2, native=exchange)
    assert all("not running the same all-reduces" in m for m in messages), messages
    assert any("16 bytes" in m and "32 bytes" in m for m in messages)


def _intruder(address, results):
    try:
        os.setuid(65534)  # nobody: another user on this host
        for _ in range(500):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(address)
                break
            except ConnectionRefusedError:  # the hub is not listening yet
                sock.close()
                time.sleep(0.01)
        try:  # the hub may hang up before or after this hello: either way it sends nothing
            socket.send_fds(sock, [struct.pack("<4sIII", b"TFRS", 1, 1, 2)],
                            [os.memfd_create("x")])
            reply = sock.recv(16)
        except (BrokenPipeError, ConnectionResetError):
            reply = b""
        results.put(("intruder", reply))  # b"": the hub hung up on it, sent it nothing
    except BaseException as exc:
        results.put(("intruder", repr(exc)))


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to become another user")
def test_another_users_process_cannot_join():
    plans, results = _plans(2), CTX.Queue()
    hub = CTX.Process(target=_member, args=(plans[0], 1 << 20, [_floats("float32", 4)], results))
    hub.start()
    intruder = CTX.Process(target=_intruder, args=(plans[0].address, results))
    intruder.start()
    assert results.get(timeout=30) == ("intruder", b"")
    peer = CTX.Process(target=_member, args=(plans[1], 1 << 20, [_floats("float32", 4)], results))
    peer.start()
    got = dict((rank, out) for rank, out, _ in (results.get(timeout=60) for _ in range(2)))
    for p in (hub, intruder, peer):
        p.join(30)
    expected = (_floats("float32", 4)(0) + _floats("float32", 4)(1)).tobytes()
    assert got[0] == got[1] == [expected]


def _squatter(address, ready):
    os.setuid(65534)  # another user takes the address first
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(1)
    ready.set()
    conn, _ = server.accept()
    conn.recv(64)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to become another user")
def test_a_worker_does_not_join_an_exchange_another_user_holds():
    plans, ready = _plans(2), CTX.Event()
    squatter = CTX.Process(target=_squatter, args=(plans[0].address, ready))
    squatter.start()
    try:
        assert ready.wait(30)
        with pytest.raises(ConnectionError, match="held by another user's process"):
            ShmGroup(plans[1], connect_timeout=30)
    finally:
        squatter.kill()
        squatter.join(30)
