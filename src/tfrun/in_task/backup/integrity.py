"""Whether a backup's bytes are the ones written: checksums, and the check before a load.

A backup's state files (``snapshot``) are hashed from memory before they are written, and
the checksums go into the backup's mark as its *files record*, ``{file name: {"bytes": n,
"xxh3": checksum}}``. ``check(directory, files)`` reads every file back and raises
``StateDamaged`` -- naming the file and what differed -- for a missing file, a short one,
or one whose bytes changed (a failing disk, a bad copy, a write cut short outside tfrun).
It reads with ordinary reads, not a mapping: an I/O error from the device is then an
error tfrun reports, not a SIGBUS that kills the task.

``StateDigest`` computes the same checksum from a state's values arriving one variable at
a time (sent by a peer), so a replica checks a state it never writes.

xxh3 (64 bits) because it is fast where it runs -- measured here on 1 GiB: 24 GB/s, with
Python's other threads running meanwhile (the GIL released), against 4 GB/s for
zlib.crc32 and 0.9 GB/s for blake2b -- and its 64 bits miss a random change with
probability 2**-64. It is a check against accidents, not against an attacker.

    >>> digest(b"")
    '2d06800538d394c2'
"""

from __future__ import annotations

import os

__all__ = ["ALIGN", "StateDamaged", "StateDigest", "aligned", "check", "digest"]

#: Each variable starts at a multiple of this inside a state's values (any dtype's
#: alignment); the bytes between two variables are zeros.
ALIGN = 64
#: Bytes per read while checking: large enough for the device, small enough for memory.
_CHUNK = 16 << 20
_VALUES, _INDEX = "values.bin", "variables.json"


class StateDamaged(RuntimeError):
    """A state's file is missing, short, or holds other bytes than were written.

    ``file``: the file's name; ``what``: what differed, in words."""

    def __init__(self, file: str, what: str) -> None:
        super().__init__(f"{file}: {what}")
        self.file, self.what = file, what


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of ``ALIGN``.

    >>> aligned(1), aligned(64), aligned(65)
    (64, 64, 128)
    """
    return -(-nbytes // ALIGN) * ALIGN


def digest(data) -> str:
    """The checksum of ``data`` (bytes-like) that a files record keeps: xxh3, 64 bits, hex."""
    import xxhash

    return xxhash.xxh3_64_hexdigest(data)


class StateDigest:
    """The checksum of ``values.bin`` computed from its variables' values in order (each
    padded with zeros to the next ``ALIGN`` bytes, as in the file).

    >>> import numpy as np
    >>> whole = StateDigest(); whole.add(np.zeros(3, "float32")); whole.add(np.ones(2, "int64"))
    >>> whole.hexdigest() == digest(bytes(64) + np.ones(2, "int64").tobytes() + bytes(48))
    True
    """

    def __init__(self) -> None:
        import xxhash

        self._hash = xxhash.xxh3_64()

    def add(self, value) -> None:
        import numpy as np

        data = np.ascontiguousarray(value)
        self._hash.update(memoryview(data).cast("B"))
        self._hash.update(bytes(aligned(data.nbytes) - data.nbytes))

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _check_file(path: str, record: dict | None) -> None:
    """Raise StateDamaged unless ``path`` holds the bytes ``record`` describes (None: a
    backup written without checksums; only that the file can be read)."""
    import xxhash

    name = os.path.basename(path)
    try:
        size = os.path.getsize(path)
    except OSError as error:
        raise StateDamaged(name, f"missing ({error.strerror or error})") from None
    want = size if record is None else int(record["bytes"])
    if size < want:
        raise StateDamaged(name, f"truncated: {size} bytes, {want} were written")
    hashed, buffer = xxhash.xxh3_64(), bytearray(min(_CHUNK, max(want, 1)))
    view = memoryview(buffer)
    try:
        # O_DIRECT pads the values to whole blocks: the checksum covers the first ``want``
        with open(path, "rb", buffering=0) as f:
            done = 0
            while done < want:
                got = f.readinto(view[:min(len(buffer), want - done)])
                if not got:
                    raise StateDamaged(name, f"truncated while read: {done} of {want} bytes")
                hashed.update(view[:got])
                done += got
    except OSError as error:
        raise StateDamaged(name, f"unreadable: {error.strerror or error}") from None
    if record is not None and hashed.hexdigest() != record["xxh3"]:
        raise StateDamaged(name, f"checksum {hashed.hexdigest()}, {record['xxh3']} was "
                                 "written (its bytes changed on the disk or in a copy)")


def check(directory: str, files: dict | None) -> None:
    """Raise StateDamaged when a state file in ``directory`` does not match its files
    record (missing, truncated, other bytes); ``files`` None: that they exist and read."""
    for name in (_INDEX, _VALUES):
        _check_file(os.path.join(directory, name), None if files is None else files.get(name))
