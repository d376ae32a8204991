"""The VM tier's memory streams kept as shared chunks (src/envgit/vm/memchunks.py, docs/FORMAT.md
"VM memory snapshots"), in process on streams shaped as QEMU writes them (a page: an 8-byte
word and 4 KiB; a zero page: the word and a byte). Known answers pin the cut and the names, so
a second implementation reading FORMAT.md cuts and names the same chunks."""

import hashlib
import os
import struct

from envgit.vm import memchunks


def _stream(pages: dict[int, bytes], n_pages=256, zero=()) -> bytes:
    """A stream as QEMU writes one: a header, then the RAM block's pages, each an 8-byte word
    (the page's offset | flags) and its 4 KiB (the block's first with its name, the others with
    the continue flag), a zero page as the word and one byte; then a device state. `pages`
    replaces some pages' bytes; `zero` are zero pages."""
    out = bytearray(b"QEVM\x00\x00\x00\x03" + hashlib.shake_256(b"setup").digest(300))
    for i in range(n_pages):
        if i in zero:
            out += struct.pack(">Q", (i << 12) | 0x22) + b"\0"
            continue
        data = pages.get(i) or hashlib.shake_256(f"page {i}".encode()).digest(4096)
        if i == 0:
            out += struct.pack(">Q", 0x08) + bytes([3]) + b"mem" + data
        else:
            out += struct.pack(">Q", (i << 12) | 0x28) + data
    out += struct.pack(">Q", 0x10) + hashlib.shake_256(b"devices").digest(200_000)
    return bytes(out)


def _store(tmp_path, name, data):
    d = tmp_path / name
    d.mkdir()
    (d / "memory.stream").write_bytes(data)
    got = memchunks.store(str(tmp_path / "chunks"), str(d / "memory.stream"), str(d / "memory.chunks"))
    return d / "memory.chunks", got


def _read_back(tmp_path, listed) -> tuple[bytes, list]:
    r, w = os.pipe()
    errors: list = []
    import threading
    t = threading.Thread(target=memchunks.stream_into, args=(str(tmp_path / "chunks"), str(listed), w, errors))
    t.start()
    out = bytearray()
    while chunk := os.read(r, 1 << 16):
        out += chunk
    os.close(r)
    t.join()
    return bytes(out), errors


def test_a_stream_is_cut_named_and_read_back_whole(tmp_path):
    data = _stream({})
    listed, got = _store(tmp_path, "a", data)
    lines = listed.read_text().splitlines()
    assert lines[0] == "envgit memory chunks 1"
    sizes = [int(line.split()[1]) for line in lines[1:]]
    assert sum(sizes) == len(data) == got["bytes"] and got["chunks"] == len(sizes)
    assert all(s <= memchunks.MAX for s in sizes)
    assert not (tmp_path / "a" / "memory.stream").exists()          # the stream is its chunks now
    # known answers: where the first chunks end and what they are named
    assert sizes[:4] == KNOWN_SIZES, sizes[:4]
    assert [line.split()[0][:16] for line in lines[1:3]] == KNOWN_NAMES
    back, errors = _read_back(tmp_path, listed)
    assert back == data and errors == []


def test_a_stream_with_a_few_pages_changed_stores_only_the_chunks_around_them(tmp_path):
    _, first = _store(tmp_path, "a", _stream({}))
    changed = _stream({17: b"\x01" * 4096, 200: b"\x02" * 4096})
    listed, second = _store(tmp_path, "b", changed)
    assert first["stored"] == first["bytes"]
    assert 0 < second["stored"] <= 2 * 8 * 4104 + 100, second   # two pages: their two groups
    assert _read_back(tmp_path, listed)[0] == changed


def test_a_page_added_before_others_leaves_the_groups_after_it_shared(tmp_path):
    _, first = _store(tmp_path, "a", _stream({}, zero=range(100, 120)))
    _, second = _store(tmp_path, "b", _stream({}, zero=range(101, 120)))     # page 100 now written
    assert 0 < second["stored"] <= 2 * 8 * 4104, second


def test_bytes_that_are_not_page_records_are_cut_and_read_back(tmp_path):
    data = hashlib.shake_256(b"no pages here").digest(1_000_000)
    listed, got = _store(tmp_path, "a", data)
    assert got["chunks"] == 8 and _read_back(tmp_path, listed)[0] == data


def test_a_flipped_byte_ends_the_read_back_and_is_said(tmp_path):
    listed, _ = _store(tmp_path, "a", _stream({}))
    h = listed.read_text().splitlines()[2].split()[0]
    p = tmp_path / "chunks" / h[:2] / h
    b = bytearray(p.read_bytes())
    b[100] ^= 0x80
    p.write_bytes(bytes(b))
    back, errors = _read_back(tmp_path, listed)
    assert len(back) < len(_stream({})) and errors and h in errors[0]
    assert any(h in problem for problem in memchunks.verify(str(tmp_path / "chunks"), str(listed)))


def test_sweep_keeps_what_a_kept_list_names_and_nothing_while_a_list_is_damaged(tmp_path):
    a, _ = _store(tmp_path, "a", _stream({}))
    b, _ = _store(tmp_path, "b", _stream({5: b"\x07" * 4096}))
    only_b = {line.split()[0] for line in b.read_text().splitlines()[1:]} - \
             {line.split()[0] for line in a.read_text().splitlines()[1:]}
    assert only_b
    a.with_name("broken").write_text("not a list\n")
    assert memchunks.sweep(str(tmp_path / "chunks"), [str(a), str(a.with_name("broken"))]) == 0
    assert memchunks.sweep(str(tmp_path / "chunks"), [str(a)]) > 0
    left = {p.name for p in (tmp_path / "chunks").rglob("*") if p.is_file()}
    assert not (only_b & left)
    assert _read_back(tmp_path, a)[0] == _stream({})


def _reference_cuts(data: bytes) -> list[int]:
    """FORMAT.md's rule read directly, on a stream whose records are known to start right
    after the 308-byte header and to end where the device state's word (0x10) stands."""
    ends, start, p = [], 0, 308
    while True:
        word = int.from_bytes(data[p:p + 8], "big")
        flags, page = word & 0xFFF, word >> 12
        if flags & ~0x20 not in (0x02, 0x08):
            break
        length = (8 if flags & 0x20 else 9 + data[p + 8]) + (4096 if flags & ~0x20 == 0x08 else 1)
        if (page % 8 == 0 and p - start >= 16 << 10) or p - start + length > 128 << 10:
            ends.append(p)
            start = p
        p += length
    while len(data) - start > 128 << 10:
        start += 128 << 10
        ends.append(start)
    return ends + [len(data)]


def test_the_cut_is_the_formats_rule(tmp_path):
    for n, data in enumerate((_stream({}), _stream({3: b"\0" * 4096}, n_pages=600, zero=range(40, 300)))):
        listed, _ = _store(tmp_path, f"s{n}", data)
        sizes = [int(line.split()[1]) for line in listed.read_text().splitlines()[1:]]
        assert [sum(sizes[:i + 1]) for i in range(len(sizes))] == _reference_cuts(data)


KNOWN_SIZES = [33144, 32832, 32832, 32832]
KNOWN_NAMES = ["c6ba0a0de3550ae1", "4c8e3d0b88bd4f22"]


def test_a_meta_json_of_the_wrong_kinds_or_without_its_lists_hash_is_refused(tmp_path):
    """meta.json is read whole or refused with what is wrong: not an object, a number as a
    string, a chunk snapshot that names no list hash (one flipped bit in the key's name must
    not turn the list's check off)."""
    import json

    import pytest

    from envgit.vm import memstore
    good = {"format": memstore.CHUNKS_FORMAT, "memory_mb": 384, "cpus": 1, "list_hash": "ab" * 32}
    for meta, said in (([1], "not a JSON object"), ({**good, "memory_mb": "384"}, "memory_mb is not"),
                       ({**good, "cpus": True}, "cpus is not"), ({**good, "memory_mb": 0}, "out of range"),
                       ({k: v for k, v in good.items() if k != "list_hash"}, "names no list_hash"),
                       ({**good, "list_hash": None}, "names no list_hash")):
        (tmp_path / "meta.json").write_text(json.dumps(meta))
        with pytest.raises(ValueError, match=said):
            memstore.read_meta(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps(good))
    assert memstore.read_meta(tmp_path) == good
    (tmp_path / "list").write_bytes(b"x")
    assert not memchunks.list_matches(tmp_path / "list", None)
    assert memchunks.list_matches(tmp_path / "list", memchunks.digest(b"x"))
