"""A disk whose writes are slow for real: an ext4 filesystem on a loop device that the
kernel's block throttle holds to a given rate (root; Linux cgroup v1's blkio controller).

Issue 43's acceptance allows, instead of a model whose state alone makes a backup slow,
"a backup made slow in an honest way (a run dir on a throttled device, not a sleep inside
tfrun)". Every write that reaches this device -- a backup's files, their fsync, the
kernel's writeback -- is held to ``write_bytes_per_second``, for whichever process makes
it; nothing in tfrun or the test program knows.

    >>> with throttled_disk(tmp_path, 8 << 30, 150 << 20) as disk:  # doctest: +SKIP
    ...     Run(disk, [...], name="slow")  # its run directory on the slow disk
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

__all__ = ["throttled_disk"]

#: The root blkio cgroup's write limits: a rule there holds every process of the machine
#: (they all are in it here; the limit is the device's, whoever writes).
_WRITE_LIMITS = Path("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device")


def _run(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout.strip()


@contextlib.contextmanager
def throttled_disk(where: Path, size: int, write_bytes_per_second: int) -> Iterator[Path]:
    """A fresh filesystem of ``size`` bytes (a sparse image under ``where``) mounted at
    ``where/throttled``, its writes held to ``write_bytes_per_second``; all undone after."""
    if not _WRITE_LIMITS.exists():
        raise RuntimeError(f"no {_WRITE_LIMITS}: a throttled disk needs root and Linux "
                           "cgroup v1's blkio controller mounted there")
    free = shutil.disk_usage(where).free
    if free < size:
        # The image is sparse: blocks come from the disk under it as the filesystem fills,
        # and a full one there turns the filesystem read-only mid-run, failing for a reason
        # that is not the test's.
        raise RuntimeError(f"a throttled disk of {size / 2**30:.1f} GiB needs as much free "
                           f"under {where}; received: {free / 2**30:.1f} GiB free. Free space "
                           "there (or point TMPDIR at a larger disk) and run again")
    image, mount = where / "throttled.img", where / "throttled"
    with open(image, "wb") as f:
        f.truncate(size)
    device = _run("losetup", "--find", "--show", str(image))
    try:
        number = os.stat(device).st_rdev
        rule = f"{os.major(number)}:{os.minor(number)}"
        _run("mkfs.ext4", "-q", device)
        mount.mkdir()
        _run("mount", device, str(mount))
        try:
            _WRITE_LIMITS.write_text(f"{rule} {write_bytes_per_second}\n")
            yield mount
        finally:
            _WRITE_LIMITS.write_text(f"{rule} 0\n")  # a limit of 0 removes the rule
            # A process of a failed test may still hold a file: detach now, freed at its end.
            if subprocess.run(["umount", str(mount)], capture_output=True).returncode:
                _run("umount", "--lazy", str(mount))
            mount.rmdir()
    finally:
        _run("losetup", "--detach", device)
        image.unlink()
