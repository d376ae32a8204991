"""Reading QEMU 7.2's background-snapshot stream exactly, record by record: where its header
ends, the RAM section's block list, every RAM page record (which page, where its bytes are),
and the device state after the RAM. postcopy.py uses it to feed a restore page by page.

The stream (QEMU's migration/savevm.c and ram.c, as a background snapshot writes it):

  "QEVM" be32 3                        magic and version
  0x07 ...                             the configuration (the machine's name, subsections)
  0x01 be32 sid u8 3 "ram" be32 0 be32 4     the RAM section's start:
       be64 (total bytes | 0x04)       then per RAM block: u8 len, its name, be64 its length
       be64 0x10                       end of section part (EOS)
       0x7e be32 sid                   footer
  0x02 be32 sid  records... be64 0x10  0x7e be32 sid      RAM parts, any number
       a record: be64 word (page offset in its block | flags); unless flags has 0x20
       (CONTINUE) u8 len + the block's name; then 4096 bytes (0x08, a page) or 1 byte
       (0x02, a page whose bytes are all that byte: zero)
  0x04 ...                             the device state (non-iterable sections, in full)
  0x00                                 end of the stream
  0x06 be32 n + n bytes of JSON        its description (optional)

`index` writes what `parse` found as `memory.pages` beside the snapshot's chunk list
(docs/FORMAT.md): a line "envgit memory pages 1", a line of JSON (the byte ranges, the RAM
section's id, the blocks), then per block in that order a little-endian u64 count and that many
u64 pairs (page offset in the block, stream offset of its 4096 bytes), sorted by page offset.
`read_index` reads it back; a restore needs it to send any page without reading the rest.

Only these record kinds are read; anything else (compression, XBZRLE) is a stream this
module does not take apart, and `parse` says so (the restore then reads the whole stream).
"""

import json
import struct
from array import array

MAGIC = b"QEVM\x00\x00\x00\x03"
SECTION_START, SECTION_PART, SECTION_END, SECTION_FULL = 0x01, 0x02, 0x03, 0x04
FOOTER, EOF, VMDESC, COMMAND = 0x7E, 0x00, 0x06, 0x08
F_ZERO, F_MEM_SIZE, F_PAGE, F_EOS, F_CONTINUE = 0x02, 0x04, 0x08, 0x10, 0x20
PAGE = 4096


class NotReadable(ValueError):
    """A stream this reader does not take apart."""


class Layout:
    """What `parse` found: byte ranges of the stream, the RAM blocks, the page records."""

    def __init__(self):
        self.header_end = 0         # [0, header_end): magic, version, configuration
        self.setup = (0, 0)         # the RAM section's start, through its footer
        self.section_id = 0
        self.blocks: list[tuple[str, int]] = []     # (name, length) in the stream's order
        self.pages: dict[str, dict[int, int]] = {}  # block -> {page offset: stream offset of its bytes}
        self.device = (0, 0)        # the device sections, without the end byte and description
        self.last_block = None


def parse(buf) -> Layout:
    """The layout of a whole background-snapshot stream in `buf` (bytes or mmap)."""
    n = len(buf)
    if bytes(buf[:8]) != MAGIC:
        raise NotReadable("not a QEMU migration stream of version 3")
    lay = Layout()
    start = bytes(buf[:4096]).find(b"\x03ram\x00\x00\x00\x00\x00\x00\x00\x04")
    if start < 5 or buf[start - 5] != SECTION_START:
        raise NotReadable("no RAM section where a background snapshot starts it")
    lay.header_end = p = start - 5
    lay.section_id = struct.unpack_from(">I", buf, p + 1)[0]
    p = start + 12
    word = struct.unpack_from(">Q", buf, p)[0]
    if not word & F_MEM_SIZE:
        raise NotReadable("the RAM section does not start with its block list")
    total, p = word & ~0xFFF, p + 8
    while total > 0:
        ln = buf[p]
        name = bytes(buf[p + 1:p + 1 + ln]).decode()
        length = struct.unpack_from(">Q", buf, p + 1 + ln)[0]
        lay.blocks.append((name, length))
        lay.pages[name] = {}
        total -= length
        p += 1 + ln + 8
    p = _eos_and_footer(buf, p, lay.section_id)
    lay.setup = (lay.header_end, p)
    while p < n and buf[p] == SECTION_PART:
        if struct.unpack_from(">I", buf, p + 1)[0] != lay.section_id:
            raise NotReadable("a section part of another section than RAM's")
        p = _records(buf, p + 5, lay)
        p = _footer(buf, p, lay.section_id)
    if p >= n or buf[p] != SECTION_FULL:
        raise NotReadable(f"no device state after the RAM (byte {p})")
    tail = bytes(buf[max(p, n - (1 << 20)):n])
    at = tail.rfind(b"\x00\x06")
    end = n - 1
    if at >= 0:
        cut = n - len(tail) + at
        if cut + 6 <= n and struct.unpack_from(">I", buf, cut + 2)[0] == n - (cut + 6):
            end = cut
    if buf[end] != EOF:
        raise NotReadable("the device state does not end where the stream says")
    lay.device = (p, end)
    return lay


def _records(buf, p, lay) -> int:
    block = lay.last_block         # a CONTINUE record's block may be named in an earlier part
    while True:
        word = struct.unpack_from(">Q", buf, p)[0]
        flags, addr = word & 0xFFF, word & ~0xFFF
        p += 8
        if flags & F_EOS:
            lay.last_block = block
            return p
        kind = flags & ~F_CONTINUE
        if kind not in (F_PAGE, F_ZERO):
            raise NotReadable(f"a RAM record of a kind not read here (flags {flags:#x})")
        if not flags & F_CONTINUE:
            ln = buf[p]
            block = bytes(buf[p + 1:p + 1 + ln]).decode()
            p += 1 + ln
        if block not in lay.pages:
            raise NotReadable(f"a page of a RAM block the stream did not list ({block})")
        if kind == F_PAGE:
            lay.pages[block][addr] = p
            p += PAGE
        else:
            lay.pages[block].pop(addr, None)
            if buf[p] != 0:
                raise NotReadable("a page filled with a byte other than zero")
            p += 1


def _eos_and_footer(buf, p, sid) -> int:
    if struct.unpack_from(">Q", buf, p)[0] != F_EOS:
        raise NotReadable("the RAM section's start does not end where expected")
    return _footer(buf, p + 8, sid)


def _footer(buf, p, sid) -> int:
    if buf[p] != FOOTER or struct.unpack_from(">I", buf, p + 1)[0] != sid:
        raise NotReadable(f"no section footer at byte {p}")
    return p + 5


INDEX_HEADER = b"envgit memory pages 1\n"


def index(lay: Layout) -> bytes:
    """`lay` as the bytes of a `memory.pages` file."""
    head = {"header_end": lay.header_end, "setup": list(lay.setup), "section_id": lay.section_id,
            "blocks": [[name, length] for name, length in lay.blocks], "device": list(lay.device)}
    out = [INDEX_HEADER, json.dumps(head, separators=(",", ":")).encode() + b"\n"]
    for name, _ in lay.blocks:
        pages = lay.pages[name]
        flat = array("Q")
        for addr in sorted(pages):
            flat.append(addr)
            flat.append(pages[addr])
        if flat.itemsize != 8:
            raise NotReadable("no 64-bit array type here")
        out.append(struct.pack("<Q", len(pages)) + _little(flat))
    return b"".join(out)


def read_index(data: bytes) -> Layout:
    """The Layout a `memory.pages` file holds; NotReadable when it is not one."""
    if not data.startswith(INDEX_HEADER):
        raise NotReadable("not a memory pages index")
    nl = data.index(b"\n", len(INDEX_HEADER))
    head = json.loads(data[len(INDEX_HEADER):nl])
    lay = Layout()
    lay.header_end, lay.section_id = int(head["header_end"]), int(head["section_id"])
    lay.setup, lay.device = tuple(head["setup"]), tuple(head["device"])
    lay.blocks = [(str(name), int(length)) for name, length in head["blocks"]]
    p = nl + 1
    for name, _ in lay.blocks:
        if p + 8 > len(data):
            raise NotReadable("a memory pages index cut short")
        (count,) = struct.unpack_from("<Q", data, p)
        p += 8
        if p + 16 * count > len(data):
            raise NotReadable("a memory pages index cut short")
        flat = array("Q")
        flat.frombytes(data[p:p + 16 * count])
        if struct.pack("<H", 1) != array("H", [1]).tobytes():
            flat.byteswap()
        p += 16 * count
        lay.pages[name] = dict(zip(flat[0::2], flat[1::2], strict=True))
    if p != len(data):
        raise NotReadable("a memory pages index with bytes after its last block")
    return lay


def _little(flat: array) -> bytes:
    if struct.pack("<H", 1) != array("H", [1]).tobytes():
        flat = array("Q", flat)
        flat.byteswap()
    return flat.tobytes()
