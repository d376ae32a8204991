"""Real values echoed back in a response body: found in the forms a body carries them, and put
back as the placeholder before the step can read them (proxy/credentials.py drives this).

A server may print what it was sent (a debug endpoint, an error page quoting the request, a
token-issuing API, a secrets store): any real value the gate knows must reach the step as its
placeholder. The forms looked for, each replaced by the same form of the placeholder:

- plain, percent-encoded (`quote` and `quote_plus`), JSON-escaped (`"` `\\` control
  characters, and `\\/`), UTF-16 (either byte order: a server answering in the charset a
  client asked for);
- base64 (Basic credentials echoed, a JWT-ish blob): any base64 run holding the value's
  encoding at any of the three byte alignments, standard or URL-safe alphabet; a buffered
  body's run is decoded, rewritten and encoded again;
- in a buffered body, JSON `\\uXXXX` escapes too: looked for only (a body holding the value so
  spelled is withheld whole); UTF-32 (rewritten as UTF-16 is); base85 and ascii85 (looked for
  only, as base32 is);
- on a credential's host (`deep`), readings too (readings.py): the text percent-decoded,
  HTML-unescaped, unfolded, quoted-printable, escapes undone, its hex digits alone; a value
  found only there cannot be rewritten in its spelling, so the body is withheld or cut off.

A buffered body (`scrub`) is rewritten whole; its length may change (the caller fixes
Content-Length). A streamed body (`Stream`) is rewritten chunk by chunk, holding back only the
bytes at a chunk's end that could begin a real value (an SSE event's closing newlines are
never held), so a value split across chunks is still caught; where the rewrite cannot be made
(a compressed stream, a base64 form, a length change under Content-Length) it raises `Echo` and
the caller cuts the response off.
"""

import base64
import json
import re
import zlib
from urllib.parse import quote, quote_plus

from . import readings, wrapped


class Unreadable(Exception):
    """A body a strict Stream or Gather could not decode whole (cut short, data after its
    end): on a credential's host it is withheld, since the step's client may read more."""


class Echo(Exception):
    """A real value in a body that cannot be rewritten here: `name` is its credential."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def _json(value: str) -> list[str]:
    s = json.dumps(value)[1:-1]
    return [s, s.replace("/", "\\/")]


def _lower_hex(encoded: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m[0].lower(), encoded)


def forms(value: str) -> list[str]:
    """The spellings of `value` a body may hold, plain first, always in the same order (a
    real value's and its placeholder's pair up; either may repeat itself): percent-encoded as
    encoders differ (`/` kept or not, `+` for a space, lower-case hex), JSON-escaped (also
    every character `\\u`-escaped), hex, HTML character references."""
    pct = [quote(value, safe=""), quote(value), quote_plus(value, safe=""), quote_plus(value)]
    b = value.encode("utf-8", "surrogateescape")
    return [value, *pct, *map(_lower_hex, pct), *_json(value),
            "".join(f"\\u{ord(c):04x}" for c in value), "".join(f"\\u{ord(c):04X}" for c in value),
            b.hex(), b.hex().upper(),
            "".join(f"&#{ord(c)};" for c in value), "".join(f"&#x{ord(c):x};" for c in value)]


def b64_cores(value: bytes) -> list[bytes]:
    """The base64 characters that depend only on `value`'s bytes, for each alignment of
    `value` in the encoded data (0, 1 or 2 bytes before it in its first group), in both
    alphabets: what any base64 encoding of a text holding `value` contains."""
    out = []
    for k in range(3):
        enc = base64.b64encode(b"\0" * k + value)
        core = enc[(8 * k + 5) // 6:(8 * (k + len(value))) // 6]
        for c in (core, core.translate(bytes.maketrans(b"+/", b"-_"))):
            if c not in out:
                out.append(c)
    return out


def b85_cores(value: bytes) -> list[bytes]:
    """base85 (RFC 1924, git's) and ascii85 characters that depend only on `value`, at each of
    the four byte alignments (found, never rewritten)."""
    out = []
    for enc in (base64.b85encode, base64.a85encode):
        for k in range(4):
            first = 1 if k else 0       # a group holding padding bytes depends on them
            last = (k + len(value)) // 4
            core = enc(b"\0" * k + value)[5 * first:5 * last]
            if len(core) >= 10 and core not in out:
                out.append(core)
    return out


def b32_cores(value: bytes) -> list[bytes]:
    """base32's characters that depend only on `value`, at each of the five byte alignments
    (found, never rewritten: a body holding one is withheld or cut off)."""
    out = []
    for k in range(5):
        enc = base64.b32encode(b"\0" * k + value)
        core = enc[(8 * k + 4) // 5:(8 * (k + len(value))) // 5]
        if core not in out:
            out.append(core)
    return out


_B64_RUN = re.compile(rb"[A-Za-z0-9+/_-]{8,}={0,2}")
_U_ESCAPE = re.compile(rb"\\u([0-9a-fA-F]{4})")


def unescape_u(text: str) -> str:
    """JSON's `\\uXXXX` escapes undone (what a JSON parser reads), the rest as it is."""
    return re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m[1], 16)), text)


def decoded(raw: bytes, encoding: str, cap: int) -> bytes | None:
    """At most `cap` bytes of `raw` decoded as its Content-Encoding (stacked ones too), or
    None when the gate cannot decode it."""
    try:
        run = _decoder(encoding)
        if run is None:
            return raw[:cap]
        out = bytearray()
        for piece in run(raw):
            out += piece
            if len(out) >= cap:
                break
        return bytes(out[:cap])
    except Exception:                   # zlib.error, brotli.error, zstd errors, unknown encodings
        return None


class Echoes:
    """The needles of a set of real values: pairs (name, real, placeholder)."""

    def __init__(self, pairs):
        self.swaps = []                 # (real's form, the placeholder's same form, name)
        self.cores = []                 # (a base64 core of a real value, its real value, placeholder, name)
        for name, real, ph in pairs:
            spelled = [(r.encode("utf-8", "surrogateescape"), p.encode())
                       for r, p in zip(forms(real), forms(ph), strict=True)]
            for codec in ("utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"):     # the charset asked for
                spelled.append((real.encode(codec, "surrogatepass"), ph.encode(codec)))
            for r, p in spelled:
                if (r, p, name) not in self.swaps:
                    self.swaps.append((r, p, name))
            rb = real.encode("utf-8", "surrogateescape")
            self.cores += [(c, rb, ph.encode(), name) for c in b64_cores(rb)]
        self.b32 = [(c, name) for name, real, _ in pairs
                    for c in b32_cores(real.encode("utf-8", "surrogateescape")) +
                    b85_cores(real.encode("utf-8", "surrogateescape"))]
        # looked for in the readings (readings.of): the value itself, its hex (the hex reading
        # keeps lower-case digits alone), its UTF-16/32 (percent-encoded bytes), base64 cores
        self.plain = [(real.encode("utf-8", "surrogateescape"), name) for name, real, _ in pairs]
        self.read = self.plain + [(r.hex().encode(), n) for r, n in self.plain] + \
            [(real.encode(codec, "surrogatepass"), name) for name, real, _ in pairs
             for codec in ("utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")] + \
            [(c, n) for c, _, _, n in self.cores]
        # a stream holds back a value's possible beginning in the percent/HTML readings
        self.window = readings.PER_CHAR * max((len(r) for r, _ in self.plain), default=0) + 64
        self.needles = [(r, n) for r, _, n in self.swaps] + [(c, n) for c, _, _, n in self.cores] + self.b32
        self.longest = max((len(n) for n, _ in self.needles), default=0)
        # base64 and base32 cores, looked for also with line breaks taken out (wrapped.py)
        self.broken = [(c, n) for c, _, _, n in self.cores] + self.b32
        self._broken_needles = [c for c, _ in self.broken]
        firsts = {}
        for needle, _ in self.needles:
            firsts.setdefault(needle[:1], []).append(needle)
        self._by_first = firsts

    def __bool__(self):
        return bool(self.needles)

    def found(self, data: bytes, deep: bool = False) -> str | None:
        """The credential of the first real value `data` holds in any form (`deep`: or in any
        reading, readings.of), or None."""
        if deep:
            name = self.found_read(data)
            if name is not None:
                return name
        for needle, name in self.needles:
            if needle in data:
                return name
        if b"\\u" in data:
            plain = _U_ESCAPE.sub(lambda m: chr(int(m[1], 16)).encode("utf-8", "surrogatepass"), data)
            if plain != data:
                for needle, name in self.needles:
                    if needle in plain:
                        return name
        return self.found_broken(data)

    def found_read(self, data: bytes) -> str | None:
        """The credential of a real value `data` holds in one of its readings."""
        for text in readings.of(data):
            for needle, name in self.read:
                if needle in text:
                    return name
        return None

    def read_held(self, data: bytes) -> int:
        """How many bytes at the end of `data` may begin a value in its percent/HTML reading."""
        return readings.held(data, [r for r, _ in self.plain], self.window)

    def found_broken(self, data: bytes) -> str | None:
        """The credential of a base64 or base32 core `data` holds across line breaks."""
        flat = wrapped.joined(data)
        if flat != data:
            for needle, name in self.broken:
                if needle in flat:
                    return name
        return None

    def held(self, data: bytes) -> int:
        """How many bytes at the end of `data` could be the start of a real value's form
        (they wait for the next chunk)."""
        tail = data[-(self.longest - 1):] if self.longest > 1 else b""
        best = 0
        for first, needles in self._by_first.items():
            i = tail.find(first)
            while i != -1 and len(tail) - i > best:
                rest = tail[i:]
                if any(n.startswith(rest) for n in needles):
                    best = len(rest)
                    break
                i = tail.find(first, i + 1)
        return max(best, wrapped.held(data, self._broken_needles, self.longest))

    # --- a buffered body ---------------------------------------------------------------------

    def scrub(self, body: bytes, deep: bool = False) -> tuple[bytes, list[str], str | None]:
        """(the body with every real value put back as its placeholder, the credentials
        rewritten, the credential of a value left that could not be rewritten or None).
        `deep` (a credential's host): a value in a reading of what is left is such a value."""
        names = []
        for r, p, name in self.swaps:
            if r in body:
                body = body.replace(r, p)
                names.append(name)
        if self.found_broken(body) is not None:    # base64 broken into lines: decoded whole
            body = wrapped.rewrite(body, self.cores, names)
        if any(c in body for c, _, _, _ in self.cores):
            body = _B64_RUN.sub(lambda m: self._b64_run(m[0], names), body)
        return body, sorted(set(names)), self.found(body, deep)

    def _b64_run(self, run: bytes, names: list) -> bytes:
        cores = [(real, ph, name) for c, real, ph, name in self.cores if c in run]
        if not cores:
            return run
        urlsafe = b"-" in run or b"_" in run
        core = run.rstrip(b"=")
        padded = len(core) != len(run)
        try:
            data = base64.b64decode(core + b"=" * (-len(core) % 4), altchars=b"-_" if urlsafe else None)
        except ValueError:
            return run
        for real, ph, name in cores:
            if real in data:
                data = data.replace(real, ph)
                names.append(name)
        out = base64.urlsafe_b64encode(data) if urlsafe else base64.b64encode(data)
        return out if padded else out.rstrip(b"=")


# --- a streamed body ---------------------------------------------------------------------------

class Stream:
    """One streamed body, rewritten (identity) or watched (compressed, or `rewrite` False)
    chunk by chunk. `framed`: its length is fixed by Content-Length, so a rewrite must keep
    it. Watched, `feed` raises Echo once a form of a value is complete in the decoded bytes.
    `strict` (a credential's host): readings too, and a value's possible beginning in the
    percent/HTML readings is held back at a chunk's end; the last bytes passed on are kept
    (`_sent`) so a value spanning them and the next chunk is still found in every reading."""

    def __init__(self, echoes: Echoes, encoding: str = "", framed: bool = False,
                 rewrite: bool = True, strict: bool = False):
        self.echoes, self.framed, self.strict = echoes, framed, strict
        self.decoder = _decoder(encoding)
        self.fed = False                  # strict: an empty body is whole under any coding
        if self.decoder is None and not rewrite:    # watched only (a request's body), as it is
            self.decoder = lambda chunk: [chunk]
        self.names: list[str] = []       # the credentials whose values were rewritten
        self._held = b""                  # identity: bytes that may begin a real value
        self._tail = b""                  # compressed: the decoded bytes still to be matched on
        self._waiting: list[bytes] = []   # compressed: chunks held while their end may begin one
        self._sent = b""                  # strict, identity: the last bytes passed on

    def feed(self, chunk: bytes) -> bytes:
        self.fed = self.fed or bool(chunk)
        if self.decoder is None:
            return self._rewrite(self._held + chunk)
        return self._watch(chunk)

    def end(self) -> bytes:
        if self.decoder is None:
            out, self._held = self._held, b""
            return out
        if self.strict and self.fed and isinstance(self.decoder, _Run) and not self.decoder.done():
            raise Unreadable("the compressed body ends early, or has data after its end")
        out = b"".join(self._waiting)
        self._waiting = []
        return out

    def _rewrite(self, data: bytes) -> bytes:
        e = self.echoes
        for r, p, name in e.swaps:
            if r in data:
                if self.framed and len(r) != len(p):
                    raise Echo(name)
                data = data.replace(r, p)
                self.names.append(name)
        for c, _, _, name in e.cores:
            if c in data:
                raise Echo(name)        # base64 in a stream: its run's ends cannot be rewritten here
        for c, name in e.b32:
            if c in data:
                raise Echo(name)
        name = e.found_broken(data)
        if name is not None:
            raise Echo(name)        # base64 broken into lines: not rewritten in a stream
        keep = e.held(data)
        if self.strict:
            name = e.found_read(self._sent + data)
            if name is not None:
                raise Echo(name)    # a spelling no form lists: cut, never rewritten
            if readings.overlong(self._sent[-readings.PER_CHAR:] + data):
                raise Unreadable("a character reference padded longer than the gate holds back")
            keep = max(keep, e.read_held(data))
            self._sent = (self._sent + data[:len(data) - keep])[-e.window:]
        self._held = data[len(data) - keep:] if keep else b""
        return data[:len(data) - keep] if keep else data

    def _watch(self, chunk: bytes) -> bytes:
        e = self.echoes
        for piece in self.decoder(chunk):
            seen = self._tail + piece
            name = e.found(seen, self.strict)
            if name is not None:
                raise Echo(name)
            keep = max(e.longest - 1, e.held(seen))     # a core may run on across line breaks
            if self.strict:
                keep = max(keep, e.window)
            self._tail = seen[-keep:] if keep > 0 else b""
        self._waiting.append(chunk)
        if e.held(self._tail) or self.strict and e.read_held(self._tail):
            return b""                  # the decoded end may begin a real value: wait
        out = b"".join(self._waiting)
        self._waiting = []
        return out


class Gather:
    """A compressed body with no declared length (chunked): gathered up to `cap` encoded
    bytes and, at its end, decoded, rewritten and encoded again with `encode(body, encoding)`
    (the client gets the encoding it was sent, in another length: chunked allows it); past
    `cap`, or decoding past it, watched as a Stream from there on (cut where a value is)."""

    def __init__(self, echoes: Echoes, encoding: str, cap: int, encode, strict: bool = False):
        _decoder(encoding)              # ValueError now for an encoding the gate cannot read
        self.echoes, self.encoding, self.cap, self.encode = echoes, encoding, cap, encode
        self.strict = strict
        self.buf = bytearray()
        self.stream: Stream | None = None
        self.names: list[str] = []

    def feed(self, chunk: bytes) -> bytes:
        if self.stream is not None:
            return self.stream.feed(chunk)
        self.buf += chunk
        if len(self.buf) <= self.cap:
            return b""
        return self._watched(bytes(self.buf))

    def end(self) -> bytes:
        if self.stream is not None:
            return self.stream.end()
        data, self.buf = bytes(self.buf), bytearray()
        body = decoded(data, self.encoding, self.cap + 1)
        if self.strict and data and (body is None or not whole(data, self.encoding)):
            raise Unreadable("the compressed body does not decode whole")
        if body is None:                # it does not decode (nor can the client): as it is
            name = self.echoes.found(data, self.strict)
            if name is not None:
                raise Echo(name)
            return data
        if len(body) > self.cap:
            stream = self._watch()
            return stream.feed(data) + stream.end()
        clean, names, left = self.echoes.scrub(body, self.strict)
        if left is not None:
            raise Echo(left)
        if not names:
            return data
        try:
            out = self.encode(clean, self.encoding)
        except ValueError:              # stacked encodings: not made again here
            raise Echo(names[0]) from None
        self.names = names
        return out

    def _watched(self, data: bytes) -> bytes:
        return self._watch().feed(data)

    def _watch(self) -> Stream:
        """From here on the body is watched as a stream, not gathered."""
        self.buf = bytearray()
        self.stream = Stream(self.echoes, self.encoding, strict=self.strict)
        return self.stream


PIECE = 1 << 16                         # decoded bytes looked at per step (bounded memory)


def _decoder(encoding: str):
    """chunk -> an iterator of decoded pieces of a bounded size, for a Content-Encoding (a
    list of them, as servers may stack them); None for identity. Lazy: a small body that
    inflates hugely is never held whole. Unknown encodings raise ValueError."""
    names = [e.strip().lower() for e in encoding.split(",") if e.strip()]
    names = [e for e in names if e != "identity"]
    if not names:
        return None
    return _Run([_one(n) for n in reversed(names)])     # the last applied is undone first


class _Run:
    """A stack of decoders: called with a chunk, its decoded pieces; `done()`: has every
    decoder reached its data's clean end (nothing cut short, nothing after it)?"""

    def __init__(self, steps):
        self.steps = steps              # (step, done) pairs

    def __call__(self, chunk: bytes):
        pieces = iter([chunk])
        for step, _ in self.steps:
            pieces = self._chain(pieces, step)
        return pieces

    @staticmethod
    def _chain(pieces, step):
        for p in pieces:
            yield from step(p)

    def done(self) -> bool:
        return all(done() for _, done in self.steps)


def whole(raw: bytes, encoding: str) -> bool:
    """Does `raw` decode as `encoding` to its clean end (decoded piece by piece, held never)?"""
    try:
        run = _decoder(encoding)
        if run is None:
            return True
        for _ in run(raw):
            pass
        return run.done()
    except Exception:                   # zlib.error, brotli.error, zstd errors, unknown encodings
        return False


def _inflate(d, data: bytes):
    """`data` through a zlib decompressor, at most PIECE bytes a call (a small input may
    inflate hugely); what follows its end is left in d.unused_data."""
    while True:
        piece = d.decompress(data, PIECE)
        yield piece
        data = d.unconsumed_tail
        if d.eof or (not data and len(piece) < PIECE):
            return


class _Gunzip:
    """gzip read as clients read it: every member (RFC 1952), the deflate data inflated
    whatever the trailer's CRC says (gzip(1) writes what it inflated before it complains)."""

    def __init__(self):
        self.pending, self.d, self.trailer = b"", None, 0

    def done(self) -> bool:
        """Every member whole, nothing after the last."""
        return self.d is None and self.trailer == 0 and not self.pending

    def step(self, data: bytes):
        data = self.pending + data
        self.pending = b""
        while data:
            if self.trailer:                # the 8 bytes after a member's deflate data
                cut = min(self.trailer, len(data))
                data, self.trailer = data[cut:], self.trailer - cut
                continue
            if self.d is None:
                start = _gzip_header(data)
                if start is None:           # the header is not whole yet
                    self.pending = data
                    return
                self.d, data = zlib.decompressobj(-zlib.MAX_WBITS), data[start:]
            yield from _inflate(self.d, data)
            if not self.d.eof:
                return
            data, self.d, self.trailer = self.d.unused_data, None, 8


def _gzip_header(b: bytes) -> int | None:
    """The length of the gzip member header at the start of `b`, None if `b` is too short."""
    if len(b) < 10:
        return None
    if b[:2] != b"\x1f\x8b":
        raise zlib.error("not gzip data")
    flags, i = b[3], 10
    if flags & 4:                           # FEXTRA
        if len(b) < i + 2:
            return None
        i += 2 + (b[i] | b[i + 1] << 8)
    for bit in (8, 16):                     # FNAME, FCOMMENT: zero-terminated
        if flags & bit:
            j = b.find(b"\0", i)
            if j < 0:
                return None
            i = j + 1
    if flags & 2:                           # FHCRC
        i += 2
    return i if len(b) >= i else None


ZSTD_SLICE = 256            # compressed bytes per zstd call: its output then stays within ~11 MiB


def _one(name: str):
    if name == "deflate":
        state: dict[str, zlib._Decompress | None] = {"d": None}   # (typeshed's name for zlib.Decompress)

        def step(data: bytes):
            if state["d"] is None:          # zlib-wrapped as the RFC says, or raw as some send
                if not data:
                    return
                wrapped = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
                state["d"] = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
            yield from _inflate(state["d"], data)
        return step, lambda: state["d"] is not None and state["d"].eof and not state["d"].unused_data
    if name in ("gzip", "x-gzip"):
        g = _Gunzip()
        return g.step, g.done
    if name == "br":
        import brotli
        d = brotli.Decompressor()

        def step(data: bytes):
            yield d.process(data, output_buffer_limit=PIECE)
            while not d.is_finished():      # the rest of what that input holds, PIECE at a time
                piece = d.process(b"", output_buffer_limit=PIECE)
                if not piece:
                    return
                yield piece
        return step, d.is_finished
    if name == "zstd":
        import zstandard
        zs: dict = {"d": zstandard.ZstdDecompressor().decompressobj(), "fresh": True}

        def step(data: bytes):
            i = 0
            while i < len(data):
                d = zs["d"]
                piece, i = data[i:i + ZSTD_SLICE], i + ZSTD_SLICE
                zs["fresh"] = False
                yield d.decompress(piece)
                if d.eof:                   # another frame: zstd(1) and curl read every one
                    zs["d"], zs["fresh"] = zstandard.ZstdDecompressor().decompressobj(), True
                    rest = d.unused_data
                    if rest:
                        data, i = rest + data[i:], 0
        return step, lambda: zs["fresh"]
    raise ValueError(f"the gate does not decode Content-Encoding {name!r}")
