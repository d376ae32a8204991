"""The booted guest, kept: a memory snapshot of a guest taken right after its boot (its agent
answering, no project pushed yet), in the image's cache, restored instead of booting by every
later fresh start of the same machine (a new project, a new daemon with no snapshot of its own,
a changed vm.packages): a restore under TCG is well under a second where a boot is 3-10 s.

  <image dir>/booted-<key>/   ram, device.state, meta.json, ok (as memstore's step snapshots)

`key` names everything that makes two boots the same: QEMU's whole command line (every device,
memory size, CPUs, accelerator, the kernel's command line) but for its per-machine paths, the
QEMU binary, the kernel, initramfs and tool drive. It is written
whole under a temporary name and renamed, so a build killed half-way leaves nothing under the
final name. meta.json carries a CRC-32 of both files: a damaged one (bytes flipped on disk) is
refused before the restored guest runs, and the caller boots and replaces it.

What the guests restored from it would otherwise share (the kernel's random state, a clock
stuck at the snapshot's time, no project) is set per machine by the agent's SETUP (agent.py).
"""

import hashlib
import json
import os
import shutil
import tempfile
import time
import zlib

from . import memstore

FORMAT = 1
PREFIX = "booted-"


def key(machine, args) -> str:
    """`args`: the QEMU command line the guest boots with, its per-machine paths (RAM file,
    sockets, logs) masked by the caller: every device, the memory size, CPUs, accelerator and
    kernel command line; with the QEMU binary's and the image files' identity."""
    def ident(path, mtime=True):
        # the image's files and the tool drive are named by their content already, and the
        # drive's mtime moves with each use (toolimage._touch): path and size for those
        try:
            st = os.stat(path)
            return [path, st.st_size] + ([st.st_mtime_ns] if mtime else [])
        except (OSError, TypeError):
            return [path]
    what = {"format": FORMAT, "args": args, "qemu": ident(args[0]),
            "files": [ident(p, False) for p in (machine.image.kernel, machine.image.initrd, machine.tools)]}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def path(machine, args) -> str:
    return os.path.join(machine.image.path, PREFIX + key(machine, args))


def digest(p) -> str:
    """CRC-32 of a sparse file's size, its data and where each extent is (holes not read).
    Against damage, not an adversary (who could rewrite meta.json too: the cache is the
    user's own): 2.6x faster than sha256 here, and it runs while a restore waits."""
    fd = os.open(p, os.O_RDONLY)
    try:
        total = os.fstat(fd).st_size
        crc = zlib.crc32(f"{total}\n".encode())
        for start, end in memstore._extents(fd, total):
            crc = zlib.crc32(f"{start}\n".encode(), crc)
            off = start
            while off < end:
                data = os.pread(fd, min(end - off, 8 << 20), off)
                if not data:
                    break
                crc = zlib.crc32(data, crc)
                off += len(data)
    finally:
        os.close(fd)
    return f"{crc:08x}"


def verify(d) -> None:
    """Raises ValueError when a file of kept snapshot `d` is not what was written."""
    meta = memstore.read_meta(d)
    for name, field in ((memstore.RAM, "ram_crc32"), (memstore.DEVICE_STATE, "device_crc32")):
        if digest(os.path.join(d, name)) != meta.get(field):
            raise ValueError(f"the kept booted guest's {name} is damaged (its digest differs)")


def keep(machine, final) -> dict:
    """A memory snapshot of `machine` (just booted) as `final`; returns its meta."""
    parent = os.path.dirname(final)
    _drop_leftovers(parent)
    tmp = tempfile.mkdtemp(prefix=".booted-", dir=parent)
    try:
        meta = machine.snapshot(tmp)
        meta.update(kept=True, setup=True, ram_crc32=digest(os.path.join(tmp, memstore.RAM)),
                    device_crc32=digest(os.path.join(tmp, memstore.DEVICE_STATE)))
        memstore.commit(tmp, meta)
        replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def replace(tmp, final):
    """`tmp` renamed to `final`; one there already is moved aside first and removed."""
    old = None
    if os.path.exists(final):
        old = tempfile.mkdtemp(prefix=".booted-old-", dir=os.path.dirname(final))
        os.rename(final, os.path.join(old, "d"))
    os.rename(tmp, final)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def drop(d):
    """A kept snapshot that failed to restore: removed, so the next boot writes it anew."""
    old = tempfile.mkdtemp(prefix=".booted-old-", dir=os.path.dirname(d))
    try:
        os.rename(d, os.path.join(old, "d"))
    except OSError:
        pass
    shutil.rmtree(old, ignore_errors=True)


def used(d):
    """`d` restored: its `ok` touched, so _drop_leftovers keeps it."""
    try:
        os.utime(os.path.join(d, memstore.OK))
    except OSError:
        pass


def _drop_leftovers(parent, older_than_s=3600, unused_s=86400):
    """Temporary directories of keeps killed half-way (their process is gone after an hour),
    and kept guests neither written nor restored for a day (another memory size, an older
    QEMU: each holds the RAM its guest touched)."""
    now = time.time()
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for e in names:
        p = os.path.join(parent, e)
        try:
            if e.startswith(".booted-") and now - os.stat(p).st_mtime > older_than_s:
                shutil.rmtree(p, ignore_errors=True)
            elif e.startswith(PREFIX) and now - os.stat(os.path.join(p, memstore.OK)).st_mtime > unused_s:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass
