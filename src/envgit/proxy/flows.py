"""A mitmproxy flow as the policy reads it (`as_request`), and the answers the gate gives a
step itself (a denial, the 407 asking for the step's proxy credentials). Used by every addon."""

from mitmproxy import http

from ..policy import hostnames, network
from . import bodies, gitproto
from .flowstate import CONN, PARTIAL, Conn

_SAFE_QUERY_KEYS = {"service"}               # git's service names are no secret


def as_text(text: str) -> str:
    """`text` as UTF-8 can hold it: a byte that is not UTF-8 (mitmproxy hands it on as a lone
    surrogate, U+DC80..U+DCFF) as %XX, as a URL would carry it. A path a step sends with such a
    byte must still be on the record (the journal stores UTF-8) and in the question asked."""
    if text.isascii():
        return text
    out = []
    for ch in text:
        o = ord(ch)
        if 0xDC80 <= o <= 0xDCFF:
            out.append(f"%{o - 0xDC00:02X}")
        elif 0xD800 <= o <= 0xDFFF:
            out.append(f"%u{o:04X}")
        else:
            out.append(ch)
    return "".join(out)


def as_texts(obj):
    """as_text on every string of a record or question (dicts and lists walked)."""
    if isinstance(obj, str):
        return as_text(obj)
    if isinstance(obj, dict):
        return {as_texts(k): as_texts(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [as_texts(v) for v in obj]
    return obj


def redact_path(path: str) -> str:
    """The path with query values replaced (tokens travel in queries), as text (as_text)."""
    path = as_text(path)
    base, sep, query = path.partition("?")
    if not sep:
        return path
    parts = []
    for item in query.split("&"):
        k, eq, v = item.partition("=")
        parts.append(item if k in _SAFE_QUERY_KEYS or not eq else f"{k}=REDACTED")
    return base + "?" + "&".join(parts)


def _headers(r: http.Request) -> dict[str, str]:
    """Lower-case names; a header sent more than once keeps every value, joined by ", " (so a
    second Content-Type is seen, not dropped)."""
    out: dict[str, str] = {}
    for k, v in r.headers.fields:
        name, value = k.decode("latin-1").lower(), v.decode("latin-1")
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def conn_of(flow: http.HTTPFlow) -> Conn | None:
    """The flow's client connection, as Steps.requestheaders put it in the flow."""
    return flow.metadata.get(CONN)


def target(flow: http.HTTPFlow) -> tuple[str, int]:
    """Where the request goes: inside a tunnel mitmproxy sends every request to the tunnel's
    server, whatever the request names (that is checked against it by the policy); r.host
    would be the address the gate connected to."""
    conn = conn_of(flow)
    if conn is not None and conn.connect is not None:
        return conn.connect
    return flow.request.host, flow.request.port


def as_request(flow: http.HTTPFlow) -> network.Request:
    r = flow.request
    headers = _headers(r)
    if r.authority:                          # absolute-form target or HTTP/2 :authority
        headers[":authority"] = r.authority
    body, complete, err = None, True, ""
    if r.raw_content:
        body, complete, err = bodies.decode(r.raw_content, headers.get("content-encoding", ""),
                                            not flow.metadata.get(PARTIAL))
    conn = conn_of(flow)
    connect = conn.connect if conn is not None else None
    host, port = target(flow)
    return network.Request(
        scheme=r.scheme, host=host, port=port, method=r.method, path=r.path.partition("?")[0],
        query=r.path.partition("?")[2], headers=headers, body=body, body_error=err,
        body_complete=complete,
        connect_host=connect[0] if connect else None,
        connect_port=connect[1] if connect else None,
        sni=flow.client_conn.sni)


def hostport(host: str, port: int) -> str:
    host = hostnames.norm_host(host)
    return host if port in (80, 443) else f"{host}:{port}"


def denial_text(flow: http.HTTPFlow, d: network.Decision) -> str:
    r = flow.request
    what = f" ({d.kind})" if d.kind else ""
    return (f"envgit: denied {r.method} {r.pretty_host}{redact_path(r.path)}{what} by rule "
            f"{d.rule}\nenvgit: {d.reason}\n" + (f"envgit: {d.hint}\n" if d.hint else ""))


def deny_response(flow: http.HTTPFlow, d: network.Decision, body: bytes | None = None) -> http.Response:
    """403 with the reason; for a push, a receive-pack report rejecting each ref (`body`: the
    decoded request body, as judged)."""
    text = denial_text(flow, d)
    if d.rule.endswith("git-push") and flow.request.path.partition("?")[0].endswith("git-receive-pack"):
        report = gitproto.rejection(body or b"", f"envgit: {d.reason}", text)
        if report is not None:
            return http.Response.make(200, report, {"Content-Type": gitproto.RESULT_TYPE,
                                                    "Cache-Control": "no-cache",
                                                    "X-Envgit-Rule": d.rule})
    return http.Response.make(403, text, {"Content-Type": "text/plain; charset=utf-8",
                                          "X-Envgit-Rule": d.rule})


def proxy_auth_required() -> http.Response:
    return http.Response.make(
        407, "envgit: this proxy needs the step's credentials (set by envgit run)\n",
        {"Proxy-Authenticate": 'Basic realm="envgit"', "Content-Type": "text/plain"})
