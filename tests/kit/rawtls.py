"""A TLS server on 127.0.0.1 that writes raw bytes: each connection is handed, wrapped and with
a 10 s timeout, to `handle(tls_socket)` in a thread of its own. The credential attacks use it
where a server must answer in ways an HTTP library would not write (chunking and pauses of
its own, WebSocket frames by hand).

    with raw_tls_server(ca, ["stub.example.test"], "echo", handle) as port: ...
"""

import socket
import ssl
import threading
from contextlib import contextmanager


@contextmanager
def raw_tls_server(ca, names, stem, handle, backlog=16):
    cert, key = ca.issue(names, stem=stem)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(backlog)
    lsock.settimeout(0.2)
    stop = threading.Event()

    def one(conn):
        try:
            with ctx.wrap_socket(conn, server_side=True) as s:
                s.settimeout(10)
                handle(s)
        except (OSError, ValueError, IndexError, KeyError):     # a client gone, a bad request
            pass

    def serve():
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield lsock.getsockname()[1]
    finally:
        stop.set()
        t.join(5)
        lsock.close()


def read_head(s) -> tuple[str, dict]:
    """A raw server's view of one request: (its path, its headers by lower-case name), read up
    to the blank line (at most 64 KiB); OSError if the client closes first."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        got = s.recv(4096)
        if not got:
            raise OSError("closed")
        data += got
    lines = data.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    hdrs = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
    return lines[0].split()[1], hdrs
