"""A restore that runs the guest before its memory is read: envgit speaks the source side of
QEMU's postcopy migration from a kept background-snapshot stream (migstream.py).

QEMU (the destination, started with `-incoming` and capability postcopy-ram) is sent, on one
socket: the stream's header and RAM block list, then a package holding "listen", the device
state and "run". From "listen" on, a page the guest (or QEMU itself) touches that has not
arrived faults into QEMU's userfaultfd, and QEMU asks for it on the same socket's way back
(the return path); the guest runs from "run" on, a few milliseconds after the start. Meanwhile
every page the snapshot holds is sent, asked-for pages first, each exactly once (QEMU places a
page once; a second copy of it fails the migration), and a page asked for that the snapshot
does not hold is sent as zero, which is what it was. Then the end of the stream: QEMU stops
listening, and a page never sent reads as zero.

Where the bytes come from is the caller's (`page(block, offset) -> bytes`): the restore reads
them from the chunk store, each chunk re-hashed before any of its pages is sent. A page that
cannot be read (a damaged chunk) ends the stream, and `error` says why; QEMU 7.2 does not exit
then but pauses the guest and waits for a source that never comes back ("postcopy-paused"),
so `on_error` (the caller's) ends it: a guest never runs on with a page missing.

Commands and return-path messages as QEMU 7.2 defines them (migration/savevm.c, migration.c).
"""

import os
import queue
import socket
import struct
import threading

from . import memchunks
from . import migstream as ms
from .machine import VMError

FD_NAME = "envgit-restore"

CMD_OPEN_RETURN_PATH, CMD_POSTCOPY_ADVISE, CMD_POSTCOPY_LISTEN, CMD_POSTCOPY_RUN = 1, 3, 4, 5
CMD_POSTCOPY_RAM_DISCARD, CMD_PACKAGED = 6, 7
RP_SHUT, RP_PONG, RP_REQ_PAGES_ID, RP_REQ_PAGES = 1, 2, 3, 4
BATCH = 32                  # pages per section part sent unasked (asked-for pages go first)


def can_feed(src: str, meta: dict) -> bool:
    """Has snapshot `src` a page index (snapshots from before it was kept have none)?"""
    return bool(meta.get("pages_hash")) and os.path.isfile(os.path.join(src, memchunks.PAGES))


def prepare(src: str, croot: str, meta: dict) -> "Feed":
    """The Feed of snapshot `src`, its index and lists read and every chunk being checked
    against its name on two threads, started before QEMU is (its start takes as long): the
    device state and "run" are sent only once all are whole, so a guest never resumes from a
    damaged snapshot (the Feed's `error` names the chunk, and QEMU, left waiting, is ended by
    the caller)."""
    list_path, pages_path = os.path.join(src, memchunks.LIST), os.path.join(src, memchunks.PAGES)
    if not memchunks.list_matches(list_path, meta.get("list_hash")) or \
            not memchunks.list_matches(pages_path, meta.get("pages_hash")):
        raise VMError("its list of memory chunks or its page index is not the one written with it "
                      "(changed or torn since): `envgit fsck` says so too")
    try:
        listed = memchunks.read_list(list_path)
        with open(pages_path, "rb") as f:
            lay = ms.read_index(f.read())
        reader = memchunks.Reader(croot, listed)
        head, setup = reader.read(0, lay.header_end), reader.read(lay.setup[0], lay.setup[1] - lay.setup[0])
        device = reader.read(lay.device[0], lay.device[1] - lay.device[0])
    except (OSError, ValueError) as e:
        raise VMError(str(e)) from None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    feed = Feed(ours, lay, head, setup, device,
                lambda name, addr: reader.read(lay.pages[name][addr], ms.PAGE), threading.Event())
    feed.theirs = theirs

    def check():
        try:
            damaged = memchunks.first_damaged(croot, listed)
        except Exception as e:          # noqa: BLE001 - whatever it is, the guest never runs
            feed.fail(f"its memory chunks could not be checked: {e}")
        else:
            if damaged is not None:
                feed.fail(f"memory chunk {damaged} is damaged (its bytes do not hash to its "
                          "name); `envgit fsck` lists the snapshots that use it")
        finally:
            feed.ready.set()            # the feed waits for it: set whatever happened
    threading.Thread(target=check, name="vm-restore-check", daemon=True).start()
    return feed


def start(qmp, feed: "Feed") -> "Feed":
    """Begin the restore `feed` into the QEMU behind `qmp` (started with `-incoming defer`):
    its capabilities set, the socket's other end handed to it, the Feed on a thread."""
    qmp.cmd("migrate-set-capabilities", capabilities=capabilities())
    theirs, feed.theirs = feed.theirs, None
    if theirs is None:
        raise VMError("a restore's feed started twice")
    try:
        qmp.getfd(FD_NAME, theirs.fileno())
    finally:
        theirs.close()
    threading.Thread(target=feed.run, name="vm-postcopy", daemon=True).start()
    qmp.cmd("migrate-incoming", uri="fd:" + FD_NAME)
    return feed


def capabilities() -> list[dict]:
    return [{"capability": "x-ignore-shared", "state": False},
            {"capability": "postcopy-ram", "state": True}]


def _cmd(kind: int, data: bytes = b"") -> bytes:
    return struct.pack(">BHH", ms.COMMAND, kind, len(data)) + data


class Feed:
    """The source side of one postcopy restore, on `sock` (QEMU's end passed to it with
    getfd). `run()` in a thread; `running` is set once the package (device state and "run")
    is sent, `done` once the whole stream is."""

    def __init__(self, sock: socket.socket, lay: ms.Layout, head: bytes, setup: bytes,
                 device: bytes, page, ready=None):
        self.sock = sock
        self.ready = ready          # an Event: the device state and "run" wait for it (a check)
        self.theirs: socket.socket | None = None    # QEMU's end, until handed to it
        self.lay = lay
        self.head, self.setup, self.device = head, setup, device
        self.page = page
        self.asked: queue.SimpleQueue = queue.SimpleQueue()
        self.sent: dict[str, set] = {name: set() for name, _ in lay.blocks}
        self.sizes = dict(lay.blocks)
        self.running = threading.Event()
        self.done = threading.Event()
        self.error: str | None = None
        self.asked_count = 0
        self.on_error = None        # called (on this thread) when the stream fails after "run"
        self.last_block = None

    def run(self):
        reader = threading.Thread(target=self._return_path, name="vm-postcopy-rp", daemon=True)
        try:
            pagesizes = struct.pack(">QQ", ms.PAGE, ms.PAGE)
            package = _cmd(CMD_POSTCOPY_LISTEN) + self.device + _cmd(CMD_POSTCOPY_RUN)
            self.sock.sendall(self.head + _cmd(CMD_OPEN_RETURN_PATH)
                              + _cmd(CMD_POSTCOPY_ADVISE, pagesizes) + self.setup
                              + self._discard())
            if self.ready is not None:
                self.ready.wait()
                if self.error:
                    raise ValueError(self.error)
            self.sock.sendall(_cmd(CMD_PACKAGED, struct.pack(">I", len(package))) + package)
            reader.start()
            self.running.set()
            order = sorted(((off, name, addr) for name, pages in self.lay.pages.items()
                            for addr, off in pages.items()))
            i = 0
            while i < len(order):
                batch = self._asked_pages()
                while len(batch) < BATCH and i < len(order):
                    _, name, addr = order[i]
                    i += 1
                    if addr not in self.sent[name]:
                        batch.append((name, addr))
                        self.sent[name].add(addr)
                self._send(batch)
            self.sock.sendall(bytes([ms.EOF]))
            while True:         # pages asked for until QEMU has read the end (none are left)
                try:
                    name, addr = self.asked.get(timeout=30)
                except queue.Empty:
                    break
                if name is None:
                    break
        except (OSError, ValueError) as e:
            self.error = self.error or str(e)
            if self.running.is_set() and self.on_error is not None:
                self.on_error(self.error)
            self.running.set()
        finally:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.done.set()

    def _discard(self) -> bytes:
        """One "discard" of the first page of the first block, which no page was sent for.
        QEMU 7.2's "listen" without a discard before it leaves its postcopy state at DISCARD
        (loadvm_postcopy_handle_listen sets LISTENING, then postcopy_ram_prepare_discard sets
        DISCARD), so it would load every page as a precopy one: a memcpy into RAM that faults
        and waits for itself. After a discard the state is DISCARD when "listen" comes."""
        name = self.lay.blocks[0][0].encode()
        return _cmd(CMD_POSTCOPY_RAM_DISCARD, bytes([0, len(name)]) + name + b"\x00"
                    + struct.pack(">QQ", 0, ms.PAGE))

    def close(self):
        """Its sockets closed (a restore given up before or after it started)."""
        for sock in (self.theirs, self.sock):
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass

    def fail(self, why: str):
        """Stop before the device state is sent (the check found a damaged chunk)."""
        self.error = self.error or why
        if self.ready is not None:
            self.ready.set()

    def _asked_pages(self) -> list:
        got: list[tuple[str, int]] = []
        while True:
            try:
                name, addr = self.asked.get_nowait()
            except queue.Empty:
                return got
            if name is None:
                continue
            if name in self.sent and addr not in self.sent[name] and addr < self.sizes[name]:
                self.sent[name].add(addr)
                got.append((name, addr))

    def _send(self, batch):
        if not batch:
            return
        sid = struct.pack(">I", self.lay.section_id)
        parts = [bytes([ms.SECTION_PART]), sid]
        for name, addr in batch:
            data = self.page(name, addr) if addr in self.lay.pages[name] else None
            flags = ms.F_PAGE if data is not None else ms.F_ZERO
            if name == self.last_block:
                parts.append(struct.pack(">Q", addr | flags | ms.F_CONTINUE))
            else:
                raw = name.encode()
                parts.append(struct.pack(">QB", addr | flags, len(raw)) + raw)
                self.last_block = name
            parts.append(data if data is not None else b"\x00")
        parts.append(struct.pack(">Q", ms.F_EOS) + bytes([ms.FOOTER]) + sid)
        self.sock.sendall(b"".join(parts))

    def _return_path(self):
        """QEMU's requests: a page's block (when it changes) and offset."""
        f = self.sock.makefile("rb")
        block = None
        try:
            while True:
                head = f.read(4)
                if len(head) < 4:
                    break
                kind, ln = struct.unpack(">HH", head)
                data = f.read(ln)
                if kind == RP_SHUT:
                    break
                if kind in (RP_REQ_PAGES_ID, RP_REQ_PAGES):
                    start, size = struct.unpack_from(">QI", data)
                    if kind == RP_REQ_PAGES_ID:
                        block = data[13:13 + data[12]].decode()
                    for addr in range(start & ~0xFFF, start + max(size, 1), ms.PAGE):
                        self.asked.put((block, addr))
                        self.asked_count += 1
        except (OSError, ValueError):
            pass
        finally:
            self.asked.put((None, 0))
