"""Known answers for the pieces that read echoes the gate once missed (quick tier): base64
broken into lines (credentials/wrapped.py, through echo.Echoes) and the strict decoders that
say whether a compressed body decoded to its clean end (echo.whole, Stream(strict))."""

import base64
import gzip
import zlib

import pytest

from envgit.credentials import echo

REAL, PH = "CANARY-7f3a9c-do-not-leak", "envgit_ph_" + "P" * 32
TEXT = b'{"note": "nnnnnnnnnnnnnn", "you_sent": "' + REAL.encode() + b'"}\n'


def _wrap(data, width, sep, indent=b""):
    enc = base64.b64encode(data)
    return sep.join(indent + enc[i:i + width] for i in range(0, len(enc), width)) + sep


@pytest.mark.parametrize("width,sep,indent", [(76, b"\r\n", b""), (10, b"\n", b""), (64, b"\n", b"  "),
                                              (7, b" ", b"")])
def test_wrapped_base64_is_rewritten_in_the_same_form(width, sep, indent):
    e = echo.Echoes([("tok", REAL, PH)])
    body = b"token:\n" + _wrap(TEXT, width, sep, indent)
    assert not any(c in body for c, *_ in e.cores)          # no core in one unbroken run
    clean, names, left = e.scrub(body)
    assert (names, left) == (["tok"], None)
    assert clean == b"token:\n" + _wrap(TEXT.replace(REAL.encode(), PH.encode()), width, sep, indent)


def test_a_stream_holds_back_a_core_begun_across_a_line_break():
    e = echo.Echoes([("tok", REAL, PH)])
    body = _wrap(TEXT, 10, b"\n")
    s, out = echo.Stream(e), b""
    with pytest.raises(echo.Echo):
        for i in range(len(body)):
            out += s.feed(body[i:i + 1])
    got = b"".join(out.split())
    assert REAL[:2].encode() not in base64.b64decode(got[:len(got) // 4 * 4])


def test_an_event_streams_closing_newlines_are_never_held():
    e = echo.Echoes([("tok", REAL, PH)])
    assert e.held(b"data: x\n\n") == 0


def _fdict(data):
    c = zlib.compressobj(zdict=b"you_sent")
    return c.compress(data) + c.flush()


@pytest.mark.parametrize("raw,encoding,ok", [
    (gzip.compress(TEXT), "gzip", True),
    (gzip.compress(TEXT) + gzip.compress(TEXT), "gzip", True),
    (gzip.compress(TEXT)[:-12], "gzip", False),                # cut short
    (gzip.compress(TEXT) + b"junk", "gzip", False),           # data after its end
    (zlib.compress(TEXT), "deflate", True),
    (zlib.compress(TEXT) + b"x", "deflate", False),
    (_fdict(TEXT), "deflate", False),                         # a preset dictionary
    (gzip.compress(TEXT), "x-custom", False),
    (gzip.compress(TEXT), "gzip, x-custom", False),
])
def test_whole_says_whether_a_body_decodes_to_its_clean_end(raw, encoding, ok):
    assert echo.whole(raw, encoding) is ok


def test_a_strict_stream_cut_short_is_unreadable():
    e = echo.Echoes([("tok", REAL, PH)])
    s = echo.Stream(e, "gzip", strict=True)
    s.feed(gzip.compress(b"nothing secret")[:-10])
    with pytest.raises(echo.Unreadable):
        s.end()
    lenient = echo.Stream(e, "gzip")
    lenient.feed(gzip.compress(b"nothing secret")[:-10])
    lenient.end()
