"""Known answers for credentials/readings.py (quick tier): each reading of a text, the hold at a
stream chunk's end, and echo.Echoes using them on a credential's host (`deep`) only."""

import base64

import pytest

from envgit.credentials import echo, readings

REAL, PH = "ghp_CANARY-7f3a9c_x", "envgit_ph_" + "P" * 32
R = REAL.encode()


def _pct(s: str) -> str:
    return "".join(f"%{ord(c):02X}" for c in s)


@pytest.mark.parametrize("text,want", [
    (b"%67hp", b"ghp"),                     # partial
    (b"%67%68%70", b"ghp"),
    (b"%6a%6A", b"jj"),                     # any case
    (b"&#00103;&#X68;&#x70;&lowbar;", b"ghp_"),
    (b"&#103;hp", b"ghp"),
    (b"%26%23103%3B", b"g"),                # percent, then HTML
    (b"&#37;67", b"g"),                     # HTML, then percent
    (b"%2567", b"g"),                       # percent twice
])
def test_decoded_reads_percent_and_html(text, want):
    assert readings.decoded(text)[-1] == want


@pytest.mark.parametrize("text,want", [
    (b"a\r\n b", b"ab"),                    # obs-fold
    (b"=67=68p", b"ghp"),                   # quoted-printable
    (b"ab=\r\ncd", b"abcd"),                # its soft line break
    (b"\\x67\\150p\\_", b"ghp_"),           # C escapes: hex, octal, any character
    (b"\\67 \\000068p", b"ghp"),            # CSS escapes
    (b"67:68:70", b"676870"),               # hex with separators
    (b"0x67, 0X68 \\x70", b"676870"),
    (b"6A6b", b"6a6b"),                     # mixed case
])
def test_other_readings(text, want):
    assert want in readings.of(text)


def test_a_text_without_encodings_has_only_its_hex_reading():
    assert readings.of(b"plain words") == [b"ad"]
    assert readings.of(b"") == []


@pytest.mark.parametrize("tail,held", [
    (b"xx %67%68", 6), (b"xx &#00103;h", 9), (b"xx %6", 2), (b"xx &#00", 4), (b"xx &lowb", 5),
    (b"xx gh", 2), (b"data\n\n", 0), (b"xx %41", 0),
])
def test_held_keeps_a_possible_beginning(tail, held):
    assert readings.held(tail, [R], 400) == held


SPELLINGS = {
    "pct-all": _pct(REAL).encode(),
    "pct-first": _pct(REAL[0]).encode() + R[1:],
    "pct-last": R[:-1] + _pct(REAL[-1]).encode(),
    "pct-lower": _pct(REAL).lower().encode(),
    "html-padded": "".join(f"&#{ord(c):05d};" for c in REAL).encode(),
    "html-X": "".join(f"&#X{ord(c):X};" for c in REAL).encode(),
    "html-one": b"&#103;" + R[1:],
    "html-named": R.replace(b"_", b"&lowbar;"),
    "folded": R[:7] + b"\r\n " + R[7:],
    "utf-32": REAL.encode("utf-32-le"),
    "qp": "".join(f"={ord(c):02X}" for c in REAL).encode(),
    "hex-mixed": R.hex().upper().encode()[:10] + R.hex().encode()[10:],
    "hex-colons": ":".join(f"{c:02x}" for c in R).encode(),
    "x-escapes": "".join(f"\\x{c:02x}" for c in R).encode(),
    "octal": "".join(f"\\{c:03o}" for c in R).encode(),
    "css": "".join(f"\\{c:x} " for c in R).encode(),
    "base85": base64.b85encode(b"ab" + R),
    "ascii85": base64.a85encode(b"a" + R),
}


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_a_buffered_body_holding_a_spelling_is_withheld_on_a_credential_host(name):
    e = echo.Echoes([("tok", REAL, PH)])
    body = b"you sent: " + SPELLINGS[name] + b"\n"
    clean, names, left = e.scrub(body, deep=True)
    assert left == "tok" or (names == ["tok"] and R not in clean and e.found(clean, True) is None)


@pytest.mark.parametrize("name", ["pct-first", "html-one", "html-named", "hex-colons", "qp"])
def test_elsewhere_a_reading_is_not_looked_at(name):
    """Another host's body passes as it did (downloads): only listed forms are looked for."""
    e = echo.Echoes([("tok", REAL, PH)])
    body = b"you sent: " + SPELLINGS[name] + b"\n"
    assert e.scrub(body) == (body, [], None)


def _stream(data: bytes, step: int) -> tuple[bytes, bool]:
    s, out = echo.Stream(echo.Echoes([("tok", REAL, PH)]), strict=True), b""
    try:
        for i in range(0, len(data), step):
            out += s.feed(data[i:i + step])
        out += s.end()
    except echo.Echo:
        return out, True
    return out, False


@pytest.mark.parametrize("step", [1, 3, 7, 4096])
@pytest.mark.parametrize("name", ["pct-all", "pct-first", "pct-last", "pct-lower", "html-padded",
                                  "html-X", "html-one", "html-named"])
def test_a_stream_is_cut_before_any_of_the_value_passes(name, step):
    out, cut = _stream(b"you sent: " + SPELLINGS[name] + b"\n", step)
    assert cut
    text = b"".join([out] + readings.of(out))
    assert R[:3] not in text, out


def test_a_stream_without_the_value_passes_whole():
    body = b"a &amp; b %20 &#103;it\n\ndata: x\n\n" * 50
    for step in (1, 5, 4096):
        assert _stream(body, step) == (body, False)


def test_a_stream_with_an_overlong_reference_is_cut():
    """Zero-padded past what a stream holds back per character: cut (Unreadable; Echo when the
    value is whole in one look), even split across chunks, before any reference passes."""
    body = b"you sent: " + "".join(f"&#{ord(c):020d};" for c in REAL).encode() + b"\n"
    for step in (1, 3, 4096):
        s, out = echo.Stream(echo.Echoes([("tok", REAL, PH)]), strict=True), b""
        with pytest.raises((echo.Unreadable, echo.Echo)):
            for i in range(0, len(body), step):
                out += s.feed(body[i:i + step])
        assert b"&#" not in out
    assert readings.overlong(b"&#x000000000067;") and not readings.overlong(b"&#x0000067; &#128512;")
