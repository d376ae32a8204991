"""How a restored QEMU (started with `-incoming defer`) is given a snapshot that is not fed
page by page (postcopy.py): the whole stream of a background snapshot through a pipe, its
chunks read in order and each checked against its hash, or the device state file of the
stopped method, whose RAM file was cloned already."""

import os
import threading

from . import memchunks, memstore
from .machine import VMError


def start(qmp, src, meta, croot, whole_stream: bool, stream_errors: list) -> None:
    """Begin QEMU's incoming migration from snapshot `src`: a failure of the stream's reader is
    appended to `stream_errors` (the caller watches it while QEMU loads)."""
    qmp.cmd("migrate-set-capabilities", capabilities=[
        {"capability": "x-ignore-shared", "state": not whole_stream}])
    if whole_stream:
        if not memchunks.list_matches(os.path.join(src, memchunks.LIST), meta.get("list_hash")):
            raise VMError("its list of memory chunks is not the one written with it "
                          "(changed or torn since): `envgit fsck` says so too")
        fd, w = os.pipe2(os.O_CLOEXEC)
        threading.Thread(target=memchunks.stream_into, name="vm-restore-stream", daemon=True,
                         args=(croot, os.path.join(src, memchunks.LIST), w, stream_errors)).start()
    else:                               # QEMU reads the file itself
        fd = os.open(os.path.join(src, memstore.DEVICE_STATE), os.O_RDONLY | os.O_CLOEXEC)
    try:
        qmp.getfd("envgit-restore", fd)
    finally:
        os.close(fd)
    qmp.cmd("migrate-incoming", uri="fd:envgit-restore")
