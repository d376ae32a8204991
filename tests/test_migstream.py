"""A background snapshot's stream read record by record, its page index (`memory.pages`,
docs/FORMAT.md "VM memory snapshots"), and the source side of a postcopy restore
(src/envgit/vm/migstream.py, postcopy.py), in process, on a stream built here byte by byte as
QEMU 7.2 writes one. Known answers pin the index so a second implementation writes the same;
the restore itself, against a real QEMU, is tests/test_vm.py's."""

import hashlib
import json
import socket
import struct
import threading
import time

import pytest

from envgit.vm import migstream as ms
from envgit.vm import postcopy

SID = 2
CONFIG = b"\x07\x00\x00\x00\x08microvm\x00"          # the configuration section, as opaque bytes


def _page(i) -> bytes:
    return hashlib.shake_256(f"page {i}".encode()).digest(4096)


def _stream(parts) -> tuple[bytes, dict]:
    """A stream: header, the RAM section's start (blocks "mem" of 64 pages and "bios" of 2),
    then `parts`, each a list of (block, page, kind) with kind "page" or "zero", as section
    parts; then the device state, the end byte and a description. Also {(block, page): the
    stream offset of its bytes}."""
    out = bytearray(ms.MAGIC + CONFIG)
    out += bytes([ms.SECTION_START]) + struct.pack(">I", SID) + b"\x03ram" + struct.pack(">II", 0, 4)
    out += struct.pack(">Q", (66 * 4096) | ms.F_MEM_SIZE)
    for name, n in (("mem", 64), ("bios", 2)):
        out += bytes([len(name)]) + name.encode() + struct.pack(">Q", n * 4096)
    out += struct.pack(">Q", ms.F_EOS) + bytes([ms.FOOTER]) + struct.pack(">I", SID)
    where, last = {}, None
    for part in parts:
        out += bytes([ms.SECTION_PART]) + struct.pack(">I", SID)
        for name, i, kind in part:
            flags = ms.F_PAGE if kind == "page" else ms.F_ZERO
            if name == last:
                out += struct.pack(">Q", (i << 12) | flags | ms.F_CONTINUE)
            else:
                out += struct.pack(">Q", (i << 12) | flags) + bytes([len(name)]) + name.encode()
                last = name
            if kind == "page":
                where[(name, i)] = len(out)
                out += _page(i)
            else:
                out += b"\x00"
        out += struct.pack(">Q", ms.F_EOS) + bytes([ms.FOOTER]) + struct.pack(">I", SID)
    device = bytes([ms.SECTION_FULL]) + hashlib.shake_256(b"devices").digest(500)
    out += device + bytes([ms.EOF])
    desc = json.dumps({"page_size": 4096, "devices": []}).encode()
    out += bytes([ms.VMDESC]) + struct.pack(">I", len(desc)) + desc
    return bytes(out), where


PARTS = [[("mem", 0, "page"), ("mem", 1, "zero"), ("mem", 5, "page")],
         [("mem", 6, "page"), ("bios", 1, "page"), ("mem", 63, "page")],   # the block named again
         [("mem", 7, "zero"), ("mem", 5, "zero")]]                         # page 5 zeroed since


def test_a_stream_is_read_record_by_record():
    data, where = _stream(PARTS)
    lay = ms.parse(data)
    assert lay.header_end == 8 + len(CONFIG) and lay.section_id == SID
    assert lay.blocks == [("mem", 64 * 4096), ("bios", 2 * 4096)]
    assert lay.pages == {"mem": {0: where[("mem", 0)], 6 << 12: where[("mem", 6)], 63 << 12: where[("mem", 63)]},
                         "bios": {1 << 12: where[("bios", 1)]}}
    for (name, i), off in where.items():
        if (i << 12) in lay.pages[name]:
            assert data[off:off + 4096] == _page(i)
    a, d = lay.device
    assert data[a] == ms.SECTION_FULL and data[d] == ms.EOF and d - a == 501


def test_the_page_index_has_known_bytes_and_reads_back():
    data, _ = _stream(PARTS)
    lay = ms.parse(data)
    index = ms.index(lay)
    assert index.startswith(b"envgit memory pages 1\n")
    head = json.loads(index.split(b"\n")[1])
    assert head == {"header_end": 21, "setup": [21, 84], "section_id": 2,
                    "blocks": [["mem", 262144], ["bios", 8192]], "device": list(lay.device)}
    assert hashlib.sha256(index).hexdigest() == "b88c318dc480d0cd703004a69df6b48c4dfa6de5e62701f2ff4d919b0c900a97"
    tail = index[index.index(b"\n", 22) + 1:]
    assert struct.unpack_from("<Q", tail, 0)[0] == 3            # mem: pages 0, 6, 63
    assert struct.unpack_from("<QQ", tail, 8) == (0, lay.pages["mem"][0])
    back = ms.read_index(index)
    assert (back.pages, back.blocks, back.setup, back.device) == (lay.pages, lay.blocks, lay.setup, lay.device)
    with pytest.raises(ms.NotReadable):
        ms.read_index(index[:-3])


@pytest.mark.parametrize("damage", ["xbzrle", "footer", "magic"])
def test_a_stream_not_taken_apart_is_said(damage):
    data, where = _stream(PARTS)
    if damage == "xbzrle":      # a record kind not read here: the first page's word, flags 0x40
        off = where[("mem", 0)] - 8 - 4
        data = data[:off] + struct.pack(">Q", 0x40) + data[off + 8:]
    elif damage == "footer":
        data = data.replace(bytes([ms.FOOTER]) + struct.pack(">I", SID), b"\x00" * 5, 1)
    else:
        data = b"QEVM\x00\x00\x00\x02" + data[8:]
    with pytest.raises(ms.NotReadable):
        ms.parse(data)


def _read_stream(f, n):
    got = b""
    while len(got) < n:
        piece = f.read(n - len(got))
        assert piece, f"the stream ended {n - len(got)} bytes short"
        got += piece
    return got


def test_the_postcopy_source_sends_asked_pages_first_and_each_page_once():
    """The Feed's side of the conversation, against this test as QEMU: the commands in QEMU
    7.2's order, a discard before "listen" (without one QEMU 7.2 loads every page as precopy),
    a page asked for on the return path sent before the rest, a page asked that the stream holds
    as zero sent as zero, every page exactly once, then the end."""
    data, _ = _stream([[("mem", i, "zero" if i == 9 else "page") for i in range(64)]])
    lay = ms.parse(data)
    ours, qemu = socket.socketpair()
    for sock, opt in ((ours, socket.SO_SNDBUF), (qemu, socket.SO_RCVBUF)):
        sock.setsockopt(socket.SOL_SOCKET, opt, 4096)       # a few pages in flight at most
    feed = postcopy.Feed(ours, lay, data[:lay.header_end], data[lay.setup[0]:lay.setup[1]],
                         data[lay.device[0]:lay.device[1]],
                         lambda name, addr: data[lay.pages[name][addr]:lay.pages[name][addr] + 4096])
    threading.Thread(target=feed.run, daemon=True).start()
    f = qemu.makefile("rb", buffering=0)
    assert _read_stream(f, lay.header_end) == data[:lay.header_end]
    cmds = []
    for _ in range(3):
        kind, n = struct.unpack(">xHH", _read_stream(f, 5))
        cmds.append((kind, _read_stream(f, n)))
        if kind == postcopy.CMD_POSTCOPY_ADVISE:
            assert _read_stream(f, lay.setup[1] - lay.setup[0]) == data[lay.setup[0]:lay.setup[1]]
    assert [k for k, _ in cmds] == [postcopy.CMD_OPEN_RETURN_PATH, postcopy.CMD_POSTCOPY_ADVISE,
                                    postcopy.CMD_POSTCOPY_RAM_DISCARD]
    assert cmds[1][1] == struct.pack(">QQ", 4096, 4096)
    assert cmds[2][1] == b"\x00\x03mem\x00" + struct.pack(">QQ", 0, 4096)
    kind, n = struct.unpack(">xHH", _read_stream(f, 5))
    (size,) = struct.unpack(">I", _read_stream(f, n))
    package = _read_stream(f, size)
    assert kind == postcopy.CMD_PACKAGED
    assert package == (postcopy._cmd(postcopy.CMD_POSTCOPY_LISTEN) + data[lay.device[0]:lay.device[1]]
                       + postcopy._cmd(postcopy.CMD_POSTCOPY_RUN))
    for start in (63 << 12, 9 << 12):       # asked, as QEMU does once it listens
        body = struct.pack(">QIB", start, 4096, 3) + b"mem"
        qemu.sendall(struct.pack(">HH", postcopy.RP_REQ_PAGES_ID, len(body)) + body)
    # The feed is blocked on the full socket within its first batch until this side reads on:
    # once its return-path thread has taken both requests (a loaded machine may run it late),
    # they go in the next batch, whatever the threads' timing.
    deadline = time.monotonic() + 30
    while feed.asked_count < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert feed.asked_count == 2
    sent, block = [], None
    while True:
        t = _read_stream(f, 1)[0]
        if t == ms.EOF:
            break
        assert t == ms.SECTION_PART and struct.unpack(">I", _read_stream(f, 4))[0] == SID
        while True:
            (word,) = struct.unpack(">Q", _read_stream(f, 8))
            if word == ms.F_EOS:
                break
            if not word & ms.F_CONTINUE:
                block = _read_stream(f, _read_stream(f, 1)[0]).decode()
            kind = word & 0xFFF & ~ms.F_CONTINUE
            body = _read_stream(f, 4096 if kind == ms.F_PAGE else 1)
            sent.append((block, (word & ~0xFFF) >> 12, kind, body))
        assert _read_stream(f, 5) == bytes([ms.FOOTER]) + struct.pack(">I", SID)
    qemu.sendall(struct.pack(">HHI", postcopy.RP_SHUT, 4, 0))
    feed.done.wait(10)
    assert feed.error is None
    pages = [a for _, a, _, _ in sent]
    assert pages.index(63) < postcopy.BATCH + 8, pages      # not last, as in the stream's order
    assert ("mem", 9, ms.F_ZERO, b"\x00") in sent
    assert len(pages) == len(set(pages)) and set(pages) == set(range(64))     # each page once
    assert all(body == _page(a) for _, a, k, body in sent if k == ms.F_PAGE)


def test_a_damaged_chunk_found_by_the_check_sends_no_device_state():
    data, _ = _stream(PARTS)
    lay = ms.parse(data)
    ours, qemu = socket.socketpair()
    ready = threading.Event()
    feed = postcopy.Feed(ours, lay, data[:lay.header_end], data[lay.setup[0]:lay.setup[1]],
                         data[lay.device[0]:lay.device[1]], lambda name, addr: b"", ready)
    t = threading.Thread(target=feed.run, daemon=True)
    t.start()
    feed.fail("memory chunk abc is damaged")
    t.join(10)
    got = qemu.makefile("rb").read()
    assert feed.error == "memory chunk abc is damaged" and feed.done.is_set()
    assert data[lay.device[0]:lay.device[1]] not in got
    assert struct.pack(">BH", ms.COMMAND, postcopy.CMD_PACKAGED) not in got


def test_a_page_unreadable_after_run_ends_the_stream_and_calls_on_error():
    """A chunk changed on disk after the check (its page read fails once "run" is sent): the
    stream ends and `on_error` is called with why, so the caller ends QEMU, which would
    otherwise pause the guest and wait for a source that never comes back."""
    data, _ = _stream(PARTS)
    lay = ms.parse(data)
    ours, qemu = socket.socketpair()

    def page(name, addr):
        raise ValueError("memory chunk abc is damaged")
    feed = postcopy.Feed(ours, lay, data[:lay.header_end], data[lay.setup[0]:lay.setup[1]],
                         data[lay.device[0]:lay.device[1]], page)
    called = []
    feed.on_error = called.append
    t = threading.Thread(target=feed.run, daemon=True)
    t.start()
    got = qemu.makefile("rb").read()          # until the feed shuts its socket
    t.join(10)
    assert feed.running.is_set() and feed.done.is_set()
    assert called == ["memory chunk abc is damaged"] and feed.error == called[0]
    assert data[lay.device[0]:lay.device[1]] in got          # it had run: the failure came after
    assert got.endswith(postcopy._cmd(postcopy.CMD_POSTCOPY_RUN))    # nothing after: no end
