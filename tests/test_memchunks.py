"""The VM tier's memory streams kept as shared chunks (src/envgit/vm/memchunks.py, docs/FORMAT.md
"VM memory snapshots"), in process on streams shaped as QEMU writes them: pages of 4 KiB each
behind an 8-byte header. Known answers pin the cut and the names, so a second implementation
reading FORMAT.md cuts and names the same chunks."""

import hashlib
import os
import struct

from envgit.vm import memchunks


def _stream(pages: dict[int, bytes], n_pages=256) -> bytes:
    """A stream of `n_pages` pages: a page's header (its offset and a flag), then its 4 KiB;
    `pages` replaces some pages' bytes."""
    out = bytearray(b"QEVM\x00\x00\x00\x03")
    for i in range(n_pages):
        data = pages.get(i) or hashlib.shake_256(f"page {i}".encode()).digest(4096)
        out += struct.pack(">Q", (i << 12) | 0x08) + data
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
    assert all(memchunks.MIN <= s <= memchunks.MAX for s in sizes[:-1])
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
    assert 0 < second["stored"] <= 4 * memchunks.MAX, second      # two pages: a few chunks
    assert _read_back(tmp_path, listed)[0] == changed


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


def _reference_sizes(data: bytes) -> list[int]:
    """FORMAT.md's rule read directly: each byte projected to "0"/"1" by the format's table, a
    chunk ends after the first match of the pattern's first 14 bits that ends it at least
    8 KiB in, and at 128 KiB at most."""
    from envgit.snapshot.chunker import PROJECTION
    proj, pattern, sizes, start = data.translate(PROJECTION), b"01100000010001", [], 0
    while start < len(data):
        end = min(start + (128 << 10), len(data))
        hit = proj.find(pattern, start + (8 << 10), end) if end - start > (8 << 10) else -1
        cut = hit + 14 if hit >= 0 else end
        sizes.append(cut - start)
        start = cut
    return sizes


def test_the_cut_is_the_formats_rule(tmp_path):
    for n, data in enumerate((_stream({}), _stream({3: b"\0" * 4096}, n_pages=600), b"\0" * 300_000)):
        listed, _ = _store(tmp_path, f"s{n}", data)
        assert [int(line.split()[1]) for line in listed.read_text().splitlines()[1:]] == _reference_sizes(data)


KNOWN_SIZES = [21785, 23099, 25383, 14297]
KNOWN_NAMES = ["0115b7925b8fc940", "49d323d7aca16d67"]
