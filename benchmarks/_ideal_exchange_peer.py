"""One host's side of bench_exchange_bound.py: the scaling MLP's step in NumPy, its
gradients' bytes over plain TCP as an ideal exchange would move them.

    python _ideal_exchange_peer.py RANK PEER_ADDRESS BYTES_PER_VALUE STEPS

784-1024-1024-10, 256 samples a step; the caller pins the process to one CPU and gives
it one BLAS thread (``OPENBLAS_NUM_THREADS=1``). ``BYTES_PER_VALUE`` 0: no exchange (the
step alone). 4 or 2 (float32 or 16-bit on the wire): each bucket's bytes leave for the
peer as soon as backprop has produced them -- the last two layers' gradients after dW2,
the first layer's after dW1, the order tfrun's buckets have -- while the same number of
bytes arrive from the peer; the step ends when both buckets have crossed both ways, then
applies its own gradients. Between two hosts those are the bytes a reduce-scatter and an
all-gather move each way, without their framing, their sums, their casts or TensorFlow:
no exchange of these gradients costs a host less.
Prints one JSON line: the mean step in ms over the steps after the first fifth.
"""

import json
import socket
import sys
import threading
import time

import numpy as np

PORT = 23457
BATCH = 256


def connect(rank: int, peer: str) -> socket.socket:
    if rank == 0:
        with socket.create_server(("0.0.0.0", PORT)) as server:
            sock = server.accept()[0]
    else:
        for _ in range(300):
            try:
                sock = socket.create_connection((peer, PORT))
                break
            except OSError:
                time.sleep(0.1)
        else:
            sys.exit(f"no connection to {peer}:{PORT}")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Exchange:
    """A thread that moves each bucket's bytes both ways, in the order they are handed in."""

    def __init__(self, sock: socket.socket, largest: int) -> None:
        self.sock = sock
        self.outgoing = np.ones(largest, np.uint8)
        self.incoming = np.empty(largest, np.uint8)
        self.buckets: list[int] = []
        self.ready = threading.Condition()
        self.done = 0
        threading.Thread(target=self._run, daemon=True).start()

    def start(self, nbytes: int) -> None:
        with self.ready:
            self.buckets.append(nbytes)
            self.ready.notify_all()

    def wait(self, count: int) -> None:
        with self.ready:
            self.ready.wait_for(lambda: self.done >= count)

    def _run(self) -> None:
        taken = 0
        while True:
            with self.ready:
                self.ready.wait_for(lambda: len(self.buckets) > taken)
                nbytes = self.buckets[taken]
            taken += 1
            sender = threading.Thread(target=self.sock.sendall,
                                      args=(memoryview(self.outgoing)[:nbytes],))
            sender.start()
            view, got = memoryview(self.incoming), 0
            while got < nbytes:
                got += self.sock.recv_into(view[got:nbytes])
            sender.join()
            with self.ready:
                self.done += 1
                self.ready.notify_all()


def main() -> None:
    rank, peer, width, steps = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = np.random.default_rng(rank)
    w1, w2, w3 = (rng.normal(0, 0.03, s).astype(np.float32)
                  for s in ((784, 1024), (1024, 1024), (1024, 10)))
    x = rng.normal(size=(BATCH, 784)).astype(np.float32)
    exchange = Exchange(connect(rank, peer), (w1.size + w2.size) * 4) if width else None
    times, handed = [], 0
    for _ in range(steps):
        started = time.perf_counter()
        h1 = np.maximum(x @ w1, 0)
        h2 = np.maximum(h1 @ w2, 0)
        logits = h2 @ w3
        d3 = (logits - logits.mean(axis=1, keepdims=True)) / BATCH  # a stand-in loss gradient
        dw3 = h2.T @ d3
        dh2 = (d3 @ w3.T) * (h2 > 0)
        dw2 = h1.T @ dh2
        if exchange:
            exchange.start((w3.size + w2.size) * width)
            handed += 1
        dh1 = (dh2 @ w2.T) * (h1 > 0)
        dw1 = x.T @ dh1
        if exchange:
            exchange.start(w1.size * width)
            handed += 1
            exchange.wait(handed)
        for w, g in ((w1, dw1), (w2, dw2), (w3, dw3)):
            w -= 0.01 * g
        times.append(time.perf_counter() - started)
    kept = times[len(times) // 5:]
    print(json.dumps({"step_ms": 1000 * sum(kept) / len(kept)}), flush=True)


if __name__ == "__main__":
    main()
