"""The TCP all-reduce across hosts (issue 36): the pure plan, and real processes exchanging
over real TCP connections on loopback. No TensorFlow in these processes: they meet through
a directory standing in for TensorFlow's coordination service (the key-value store the
tasks use); the strategy-level tests run on fake hosts (tests/multihost/test_multihost.py)."""

import dataclasses
import json
import multiprocessing as mp
import os
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tfrun.in_task.exchange.tcp_allreduce import TcpGroup, TcpPlan, _identity, plan_from_env
from tfrun.in_task.exchange import shm_allreduce, tcp_handshake

CTX = mp.get_context("fork")


def env(cluster, task, **extra):
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task}), "TFRUN_RUN_DIR": "/r",
            **extra}


class TestPlan:
    def test_a_worker_on_each_host(self):
        plan = plan_from_env(env({"chief": ["a:1"], "worker": ["b:1", "c:1"]},
                                 {"type": "worker", "index": 1}))
        assert (plan.rank, plan.names, plan.hosts) == (
            2, ("chief:0", "worker:0", "worker:1"), ("a", "b", "c"))

    @pytest.mark.parametrize("cluster, task, comm", [
        ({"worker": ["a:1"]}, {"type": "worker", "index": 0}, None),                 # alone
        ({"worker": ["a:1", "a:2"]}, {"type": "worker", "index": 0}, None),          # one host
        ({"worker": ["a:1", "a:2", "b:1"]}, {"type": "worker", "index": 0}, None),   # 2 on a
        ({"worker": ["a:1", "b:1"], "ps": ["c:1"]}, {"type": "worker", "index": 0}, "tcp"),
        ({"worker": ["a:1", "b:1"], "evaluator": ["c:1"]},
         {"type": "evaluator", "index": 0}, None),
        ({"worker": ["a:1", "b:1"]}, {"type": "worker", "index": 0}, "ring"),
        ({"worker": ["a:1", "b:1"]}, {"type": "worker", "index": 0}, "nccl"),
    ])
    def test_another_exchange_applies(self, cluster, task, comm):
        extra = {"TFRUN_COMM": comm} if comm else {}
        assert plan_from_env(env(cluster, task, **extra)) is None

    def test_tcp_asked_for_applies_wherever_the_workers_are(self):
        plan = plan_from_env(env({"worker": ["a:1", "a:2", "b:1"]}, {"type": "worker", "index": 1},
                                 TFRUN_COMM="tcp,pack=4MB"))
        assert plan.rank == 1 and plan.size == 3
        one_host = env({"worker": ["localhost:1", "localhost:2"]}, {"type": "worker", "index": 0},
                       TFRUN_COMM="tcp")
        assert shm_allreduce.plan_from_env(one_host) is None  # tcp, not shared memory
        assert plan_from_env(one_host).hosts == ("localhost", "localhost")

    def test_one_host_is_shared_memory_not_tcp(self):
        one_host = env({"worker": ["localhost:1", "localhost:2"]}, {"type": "worker", "index": 0})
        assert shm_allreduce.plan_from_env(one_host) is not None


class DirectoryStore:
    """TensorFlow's coordination service key-value store, in a directory (set is atomic)."""

    def __init__(self, root):
        self.root = Path(root)

    def set(self, key, value):
        path = self.root / key.replace("/", "_")
        if path.exists():
            raise RuntimeError(f"key {key} already set")  # as the coordination service does
        (self.root / (path.name + ".tmp")).write_text(value)
        os.replace(self.root / (path.name + ".tmp"), path)

    def delete(self, key):
        (self.root / key.replace("/", "_")).unlink()

    def get(self, key, timeout):
        path = self.root / key.replace("/", "_")
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(key)
            time.sleep(0.01)
        return path.read_text()


def _plans(size):
    names = tuple(f"worker:{i}" for i in range(size))
    return [TcpPlan(rank=r, names=names, hosts=("127.0.0.1",) * size) for r in range(size)]


def _open(plan, root):
    return TcpGroup(plan, DirectoryStore(root), connect_timeout=30)


def _floats(dtype, n):
    return lambda rank: (np.random.default_rng(rank).normal(size=n) * 100).astype(dtype)


ARRAYS = [_floats("float32", 1000), _floats("float64", 7), _floats("float16", 3),
          _floats("float32", 0), _floats("float32", 1), _floats("float32", 300_001)]


def _member(plan, root, results):
    try:
        group = _open(plan, root)
        out = [group.all_reduce(a(plan.rank)) for a in ARRAYS]
        results.put((plan.rank, [o.tobytes() for o in out], [str(o.dtype) for o in out]))
        group.close()
    except BaseException as exc:  # reported to the test
        results.put((plan.rank, repr(exc), None))


def _run(size, root, member=_member, extra=(), plans=None):
    """Each rank's report (``member(plan, root, results, *extra)`` in a process per plan of
    ``plans``, by default ``_plans(size)``), and the processes (joined)."""
    results = CTX.Queue()
    procs = [CTX.Process(target=member, args=(p, root, results, *extra))
             for p in plans or _plans(size)]
    for p in procs:
        p.start()
    return _collect(results, procs), procs


def _collect(results, procs) -> dict:
    """rank -> the rest of its report, once every process has put one; the processes joined."""
    got = {}
    for _ in procs:
        rank, *rest = results.get(timeout=60)
        got[rank] = rest
    for p in procs:
        p.join(30)
    return got


@pytest.mark.parametrize("size", [2, 3, 4])
def test_sums_in_rank_order_and_every_task_gets_the_same_bits(size, tmp_path):
    got, _ = _run(size, tmp_path)
    assert sorted(got) == list(range(size))
    for i, make in enumerate(ARRAYS):
        expected = make(0)
        for rank in range(1, size):
            expected = (expected + make(rank)).astype(expected.dtype)  # rank order
        for rank in range(size):
            out, dtypes = got[rank]
            assert isinstance(out, list), out
            assert dtypes[i] == str(expected.dtype)
            assert out[i] == expected.tobytes(), (rank, i)


def _cut_member(plan, root, results, cuts):
    """Rank r all-reduces the same 5000 floats as every rank, cut at ``cuts[r]``."""
    try:
        group = _open(plan, root)
        sums = group.all_reduce_many(np.split(_floats("float32", 5000)(plan.rank), cuts[plan.rank]))
        aligned = all(s.ctypes.data % 64 == 0 for s in sums if s.size)
        results.put((plan.rank, np.concatenate(sums).tobytes(), [s.size for s in sums], aligned))
        group.close()
    except BaseException as exc:  # reported to the test
        results.put((plan.rank, repr(exc), None, None))


CUTS = [[0, 1, 1000, 1666, 1667, 3000], [], [17, 2048, 3334, 4999]]


def test_a_list_of_arrays_is_exchanged_as_its_concatenation(tmp_path):
    """all_reduce_many (a pack of gradients without concat/split): every rank gets the
    rank-order sum of the concatenation in its own pieces, wherever each rank cut it (the
    cuts fall inside, on and around the owners' slices), 64-byte aligned."""
    got, _ = _run(3, tmp_path, _cut_member, (CUTS,))
    expected = _floats("float32", 5000)(0)
    for rank in (1, 2):
        expected = expected + _floats("float32", 5000)(rank)
    for rank in range(3):
        out, sizes, aligned = got[rank]
        assert sizes == [len(piece) for piece in np.split(np.zeros(5000), CUTS[rank])], got[rank]
        assert out == expected.tobytes(), rank
        assert aligned


def _dies_after_one(plan, root, results):
    group = _open(plan, root)
    group.all_reduce(np.ones(4, np.float32))
    if plan.rank == 1:
        os._exit(3)  # no goodbye: the process just ends
    try:
        group.all_reduce(np.ones(4, np.float32))
        results.put((plan.rank, "no error"))
    except ConnectionError as exc:
        results.put((plan.rank, str(exc)))


def test_a_peer_that_dies_fails_the_others_at_once_with_its_name(tmp_path):
    results = CTX.Queue()
    procs = [CTX.Process(target=_dies_after_one, args=(p, tmp_path, results)) for p in _plans(3)]
    for p in procs:
        p.start()
    messages = dict(results.get(timeout=60) for _ in range(2))
    for p in procs:
        p.join(30)
    assert "worker:1 left the exchange" in messages[0] and "worker:0 stops too" in messages[0]
    assert "worker:1 left the exchange" in messages[2] and "worker:2 stops too" in messages[2]
    assert [p.exitcode for p in procs] == [0, 3, 0]


def _late_peer(plan, root, results):
    group = _open(plan, root)
    if plan.rank == 1:
        time.sleep(1.5)  # late for rank 0's 0.3 s timeout
        results.put((plan.rank, "late"))
        return
    try:
        group.all_reduce(np.ones(4, np.float32), timeout=0.3)
        results.put((plan.rank, "no error"))
    except TimeoutError as exc:
        results.put((plan.rank, str(exc)))


def test_an_exchange_that_outlasts_the_timeout_fails_with_it(tmp_path):
    got, _ = _run(2, tmp_path, _late_peer)
    assert got == {0: ["tfrun TCP all-reduce: exchange 1 took longer than the --comm timeout "
                       "of 0.3 s"], 1: ["late"]}


def _mismatched(plan, root, results):
    group = _open(plan, root)
    try:
        group.all_reduce(np.ones(4 if plan.rank == 0 else 8, np.float32))
        results.put((plan.rank, "no error"))
    except RuntimeError as exc:
        results.put((plan.rank, str(exc)))


def test_different_all_reduces_on_different_workers_are_an_error_not_a_wrong_sum(tmp_path):
    got, _ = _run(2, tmp_path, _mismatched)
    messages = [m for (m,) in got.values()]
    assert all("not running the same all-reduces" in m for m in messages), messages
    assert any("8 bytes" in m and "16 bytes" in m for m in messages)


def _same_bytes_other_dtype(plan, root, results):
    group = _open(plan, root)
    values = np.ones(4, np.float32) if plan.rank == 0 else np.ones(2, np.float64)
    try:
        group.all_reduce(values)  # 16 bytes on both: only the collective's identity differs
        results.put((plan.rank, "no error"))
    except RuntimeError as exc:
        results.put((plan.rank, str(exc)))


def test_the_same_bytes_of_another_collective_are_an_error_not_a_wrong_sum(tmp_path):
    """Issue 47: messages were matched by (number, bytes) only, so 4 float32 against 2
    float64 values summed each other's bits. Every frame now names its collective."""
    got, _ = _run(2, tmp_path, _same_bytes_other_dtype)
    messages = [m for (m,) in got.values()]
    assert all("not running the same all-reduces" in m for m in messages), messages
    assert any("reduce-scatter of 4 <f4 values" in m and "reduce-scatter of 2 <f8 values" in m
               for m in messages), messages


def _forms_under_attack(plan, root, results):
    """Rank 1 joins once the test has knocked on rank 0's port; each rank reports its sums,
    how long forming took it, and what it refused."""
    if plan.rank == 1:
        while not (Path(root) / "attacked").exists():
            time.sleep(0.01)
    try:
        started = time.monotonic()
        # A slow handshake limit: a listener that served connections one at a time would
        # wait on the silent ones past the 30 s formation limit.
        group = TcpGroup(plan, DirectoryStore(root), connect_timeout=30, handshake_seconds=60)
        formed = time.monotonic() - started
        out = [group.all_reduce(a(plan.rank)).tobytes() for a in ARRAYS]
        results.put((plan.rank, out, formed, group.refused))
        group.close()
    except BaseException as exc:  # reported to the test
        results.put((plan.rank, repr(exc), None, None))


def _published(root, name, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        found = sorted(Path(root).glob(f"tfrun_tcp-exchange_*_{name}"))
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"nothing published as {name}"
        time.sleep(0.01)


def _hello_and_proof(address, key, group):
    """What a key-holding rank 1 sends in a handshake with ``address``: the bytes an
    eavesdropper could capture (its hello, then its proof)."""
    with socket.create_connection(address, timeout=10) as sock:
        nonce = os.urandom(32)
        hello = tcp_handshake._HELLO.pack(tcp_handshake.MAGIC, 2, 1, 2, nonce)
        sock.sendall(hello)
        _, _, listener_nonce, _ = tcp_handshake._CHALLENGE.unpack(
            tcp_handshake.receive_exactly(sock, tcp_handshake._CHALLENGE.size))
        sent = tcp_handshake.proof(key, "connector", group, 1, 0, nonce, listener_nonce)
        sock.sendall(sent)
        assert tcp_handshake.receive_exactly(sock, 4) == b"TFOK"
    return hello, sent


def test_replayed_foreign_and_silent_hellos_take_no_slot_and_hold_nothing_up(tmp_path):
    """Issue 47: while rank 0 waits for rank 1, (a) a process without the key, (b) a replay of
    a key-holder's captured hello and proof, and (c) five connections that say nothing
    knock on its port. (a) and (b) are refused and logged with their address, (c) does not
    hold the real rank 1 up; the group forms and sums right, then the port closes and the
    key and the address are gone from the store."""
    plans = _plans(2)
    results = CTX.Queue()
    procs = [CTX.Process(target=_forms_under_attack, args=(p, tmp_path, results)) for p in plans]
    for p in procs:
        p.start()
    host, port = _published(tmp_path, "0").read_text().split("|")
    address = (host, int(port))
    key = bytes.fromhex(_published(tmp_path, "key").read_text())
    silent = [socket.create_connection(address, timeout=10) for _ in range(5)]

    # (a) The right shape, a proof made with another key: hung up on, no welcome.
    with socket.create_connection(address, timeout=10) as stranger:
        stranger.sendall(tcp_handshake._HELLO.pack(tcp_handshake.MAGIC, 2, 1, 2, os.urandom(32)))
        assert len(tcp_handshake.receive_exactly(stranger, tcp_handshake._CHALLENGE.size)) \
            == tcp_handshake._CHALLENGE.size
        stranger.sendall(os.urandom(32))
        assert stranger.recv(16) == b""

    # (b) A hello and proof captured from a real handshake (with a listener of the same key
    # and group), replayed to rank 0: its fresh nonce makes the old proof wrong.
    group = _identity(plans[0])
    decoy = socket.create_server(("127.0.0.1", 0))
    admission = tcp_handshake.Admission(decoy, key, group, 0, 2, plans[0].names, [1],
                                        time.monotonic() + 10)
    captured = {}
    helper = threading.Thread(target=lambda: captured.update(admission.run()))
    helper.start()
    hello, sent = _hello_and_proof(decoy.getsockname()[:2], key, group)
    helper.join(10)
    decoy.close()
    with socket.create_connection(address, timeout=10) as replay:
        replay.sendall(hello)
        tcp_handshake.receive_exactly(replay, tcp_handshake._CHALLENGE.size)
        replay.sendall(sent)
        assert replay.recv(16) == b""

    (tmp_path / "attacked").touch()
    got = _collect(results, procs)
    assert all(isinstance(out, list) for out, *_ in got.values()), got
    assert got[0][0] == got[1][0]
    refused = got[0][2]
    assert sum("proof for worker:1 is wrong" in line for line in refused) == 2, refused
    assert all("from 127.0.0.1:" in line for line in refused), refused
    assert sum("had not proven itself" in line for line in refused) == 5, refused
    print(f"rank 1 formed in {got[1][1]:.3f} s with five silent connections open")
    for sock in silent:
        assert sock.recv(16) == b""  # hung up on once the group formed
        sock.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=10)
    assert not list(tmp_path.glob("tfrun_tcp-exchange_*_key")), "the key stays readable"
    assert not list(tmp_path.glob("tfrun_tcp-exchange_*_0")), "the address stays published"


def _pair(key_of_connector, key_of_listener=b"k" * 32, group=b"g"):
    """A listener of rank 0 admitting rank 1, and rank 1 connecting with its key: the
    connector's outcome and the admission's refusals."""
    listener = socket.create_server(("127.0.0.1", 0))
    admission = tcp_handshake.Admission(listener, key_of_listener, group, 0, 2,
                                        ("worker:0", "worker:1"), [1], time.monotonic() + 2)
    outcome = {}

    def listen():
        try:
            outcome["listener"] = admission.run()
        except TimeoutError as error:
            outcome["listener"] = error

    thread = threading.Thread(target=listen)
    thread.start()
    try:
        outcome["connector"] = tcp_handshake.connect(
            listener.getsockname()[:2], key_of_connector, group, 1, 0, 2,
            ("worker:0", "worker:1"), time.monotonic() + 2)
    except ConnectionError as error:
        outcome["connector"] = error
    thread.join(5)
    listener.close()
    return outcome, admission.refused


def test_both_sides_prove_the_key():
    outcome, refused = _pair(b"k" * 32)
    assert isinstance(outcome["connector"], socket.socket) and set(outcome["listener"]) == {1}
    assert refused == []


def test_a_listener_without_the_key_is_refused_by_the_connecting_task():
    outcome, refused = _pair(b"k" * 32, key_of_listener=b"x" * 32)
    assert "did not prove it holds the run's key: it is not worker:0's exchange" \
        in str(outcome["connector"])
    assert isinstance(outcome["listener"], TimeoutError), outcome
    # (the connecting task hung up without a proof: the listener gave it no slot)
    assert len(refused) == 1 and "proof for worker:1 is wrong" in refused[0], refused


def _halves_member(plan, root, results):
    """The compressed exchange's two halves, the sum done by the caller (as TensorFlow
    does it: the 16-bit values widened to float32, summed in rank order, narrowed again)."""
    try:
        group = _open(plan, root)
        arrays = [_floats("float16", n)(plan.rank).view(np.uint16) for n in (1000, 1, 2501)]
        parts = group.reduce_scatter(arrays)
        total = parts[0].view(np.float16).astype(np.float32)
        for part in parts[1:]:
            total = total + part.view(np.float16).astype(np.float32)
        out = group.all_gather(total.astype(np.float16).view(np.uint16),
                               [a.shape for a in arrays])
        results.put((plan.rank, [len(p) for p in parts], [o.tobytes() for o in out]))
        group.close()
    except BaseException as exc:  # reported to the test
        results.put((plan.rank, repr(exc), None))


@pytest.mark.parametrize("size", [2, 3])
def test_reduce_scatter_then_all_gather_is_an_all_reduce_summed_by_the_caller(size, tmp_path):
    got, _ = _run(size, tmp_path, _halves_member)
    total = 1000 + 1 + 2501
    sums = np.zeros(total, np.float32)
    for rank in range(size):  # rank order, as float32, as every owner sums its slice
        sums = sums + np.concatenate([_floats("float16", n)(rank) for n in (1000, 1, 2501)]
                                     ).astype(np.float32)
    expected = np.split(sums.astype(np.float16), [1000, 1001])
    for rank in range(size):
        lengths, out = got[rank]
        assert lengths == [total * (rank + 1) // size - total * rank // size] * size, got[rank]
        assert out == [e.view(np.uint16).tobytes() for e in expected], rank


# -- two stages: shared memory on each host, then TCP across hosts --------------------------

from tfrun.in_task.exchange.hierarchical_allreduce import (HierarchicalGroup,  # noqa: E402
                                                  HierarchicalPlan, plan_from_env as two_stage_plan)


class TestTwoStagePlan:
    def test_the_same_number_of_workers_on_each_host(self):
        cluster = {"chief": ["a:1"], "worker": ["a:2", "b:1", "b:2", "c:1", "c:2"]}
        plans = [two_stage_plan(env(cluster, task)) for task in
                 [{"type": "chief", "index": 0}] + [{"type": "worker", "index": i} for i in range(5)]]
        assert [p.rank for p in plans] == list(range(6))
        assert [p.local.names for p in plans[:2]] == [("chief:0", "worker:0")] * 2
        assert [p.across.names for p in plans[:2]] == [("chief:0", "worker:1", "worker:3"),
                                                       ("worker:0", "worker:2", "worker:4")]
        assert [(p.local.rank, p.across.rank) for p in plans] == [(0, 0), (1, 0), (0, 1), (1, 1),
                                                                  (0, 2), (1, 2)]
        assert len({p.local.address for p in plans}) == 3  # one shared-memory group per host
        # and neither one-stage plan applies
        assert all(tcp_plan(env(cluster, {"type": "worker", "index": i})) is None for i in range(5))

    @pytest.mark.parametrize("cluster, comm", [
        ({"worker": ["a:1", "a:2", "b:1"]}, None),            # uneven: TensorFlow's
        ({"worker": ["a:1", "b:1"]}, None),                   # one per host: TCP alone
        ({"worker": ["a:1", "a:2"]}, None),                   # one host: shared memory alone
        ({"worker": ["a:1", "a:2", "b:1", "b:2"]}, "tcp"),    # asked for the flat TCP mesh
        ({"worker": ["a:1", "a:2", "b:1", "b:2"]}, "ring"),
        ({"worker": ["a:1", "a:2", "b:1", "b:2"], "ps": ["c:1"]}, None),
    ])
    def test_it_does_not_apply(self, cluster, comm):
        extra = {"TFRUN_COMM": comm} if comm else {}
        assert two_stage_plan(env(cluster, {"type": "worker", "index": 0}, **extra)) is None


from tfrun.in_task.exchange.tcp_allreduce import plan_from_env as tcp_plan  # noqa: E402


def _two_stage_plans(hosts, per_host):
    import uuid

    names = tuple(f"worker:{i}" for i in range(hosts * per_host))
    tag = uuid.uuid4().hex
    plans = []
    for h in range(hosts):
        local_names = names[h * per_host:(h + 1) * per_host]
        for j in range(per_host):
            from tfrun.in_task.exchange.shm_allreduce import ShmPlan

            local = ShmPlan(rank=j, names=local_names, address=f"\0tfrun-shm-test-{tag}-{h}")
            across = TcpPlan(rank=h, names=tuple(names[g * per_host + j] for g in range(hosts)),
                             hosts=("127.0.0.1",) * hosts)
            plans.append(HierarchicalPlan(rank=h * per_host + j, names=names, local=local,
                                          across=across))
    return plans


def _two_stage_member(plan, root, results):
    try:
        group = HierarchicalGroup(plan, DirectoryStore(root))
        out = [group.all_reduce(a(plan.rank)) for a in ARRAYS]
        results.put((plan.rank, [o.tobytes() for o in out], [str(o.dtype) for o in out]))
        group.close()
    except BaseException as exc:  # reported to the test
        results.put((plan.rank, repr(exc), None))


@pytest.mark.parametrize("hosts, per_host", [(2, 2), (3, 2), (2, 3)])
def test_two_stages_give_every_task_the_same_sum(hosts, per_host, tmp_path):
    """Every task gets the same bits, the sum of the host sums (each in local rank order)
    in host order -- which is the all-reduce, within float rounding of rank order."""
    plans = _two_stage_plans(hosts, per_host)
    got, _ = _run(len(plans), tmp_path, _two_stage_member, plans=plans)
    assert sorted(got) == list(range(len(plans))), got
    for i, make in enumerate(ARRAYS):
        expected = None
        for h in range(hosts):
            host_sum = make(h * per_host)
            for j in range(1, per_host):
                host_sum = (host_sum + make(h * per_host + j)).astype(host_sum.dtype)
            expected = host_sum if expected is None else (expected + host_sum).astype(host_sum.dtype)
        for rank in range(len(plans)):
            out, dtypes = got[rank]
            assert isinstance(out, list), out
            assert out[i] == expected.tobytes(), (rank, i)


# --------------------------------------------------------------------------- compressed, whole


def _compressed_member(plan, root, results, wire, two_stage=False):
    """``all_reduce_compressed`` of float32 arrays: what the exchange thread runs for a
    bucket with ``--comm compress=`` (TensorFlow's casts, as in a task)."""
    try:
        import tensorflow  # noqa: F401 -- a task has it: the casts go through it

        group = HierarchicalGroup(plan, DirectoryStore(root)) if two_stage \
            else _open(plan, root)
        arrays = [_floats("float32", n)(plan.rank) for n in (1000, 1, 2501)]
        out = group.all_reduce_compressed(arrays, wire)
        results.put((plan.rank, [o.tobytes() for o in out], [str(o.dtype) for o in out]))
        group.close()
    except BaseException as exc:  # reported to the test
        results.put((plan.rank, repr(exc), None))


def _rounded_sum(values, wire):
    """Every value rounded to ``wire``, summed as float32 in order, the sum rounded again:
    what the compressed exchange computes (NumPy's casts: the same bits as TensorFlow's)."""
    from tfrun.in_task.exchange import compression

    total = None
    for v in values:
        v = compression.up(compression.down(v, wire), wire)
        total = v if total is None else total + v
    return compression.up(compression.down(total, wire), wire)


@pytest.mark.parametrize("wire", ["fp16", "bf16"])
def test_a_compressed_all_reduce_rounds_each_gradient_and_the_sum_and_every_task_agrees(
        wire, tmp_path, monkeypatch):
    got, _ = _run(3, tmp_path, _compressed_member, extra=(wire,))
    from tfrun.in_task.exchange import compression

    monkeypatch.setattr(compression, "_tensorflow", lambda: None)  # NumPy's casts here
    for i, n in enumerate((1000, 1, 2501)):
        expected = _rounded_sum([_floats("float32", n)(r) for r in range(3)], wire)
        exact = sum(_floats("float32", n)(r).astype(np.float64) for r in range(3))
        for rank in range(3):
            out, dtypes = got[rank]
            assert isinstance(out, list), out
            assert dtypes[i] == "float32" and out[i] == expected.tobytes(), (rank, i)
        # (the values are ~100: fp16 keeps 11 bits, bf16 8)
        assert np.abs(expected - exact).max() < (1.0 if wire == "fp16" else 8.0)
        assert np.abs(expected - exact).max() > 0  # rounded indeed


def test_a_compressed_two_stage_all_reduce_rounds_the_host_sums_only(tmp_path, monkeypatch):
    """Two workers on each of two hosts: shared memory sums float32; what crosses hosts,
    the host sums, is rounded to bf16."""
    plans = [dataclasses.replace(p, across=dataclasses.replace(p.across, compression="bf16"))
             for p in _two_stage_plans(2, 2)]
    got, _ = _run(4, tmp_path, _compressed_member, extra=("bf16", True), plans=plans)
    from tfrun.in_task.exchange import compression

    monkeypatch.setattr(compression, "_tensorflow", lambda: None)
    for i, n in enumerate((1000, 1, 2501)):
        hosts = [_floats("float32", n)(2 * h) + _floats("float32", n)(2 * h + 1) for h in (0, 1)]
        expected = _rounded_sum(hosts, "bf16")
        for rank in range(4):
            assert got[rank][0][i] == expected.tobytes(), (rank, i)
