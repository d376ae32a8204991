"""The start of a step's own raw HTTPS client (Python source, run inside the step): CONNECT
argv[1] (host:port) through $HTTPS_PROXY with the step's proxy credentials, then TLS with the
CA the step trusts. It leaves `t` (the TLS socket), `host`, `port` and the imports below for
the rest of the client, which each test appends. Raw, so a test says byte for byte what the
gate sees (a request line, an upgrade, a 101), where curl would normalise it."""

TUNNEL = r'''
import base64, os, socket, ssl, struct, sys
from urllib.parse import urlsplit
host, port = sys.argv[1].rsplit(":", 1)
p = urlsplit(os.environ["HTTPS_PROXY"])
s = socket.create_connection((p.hostname, p.port), timeout=20)
auth = base64.b64encode(f"{p.username}:{p.password}".encode()).decode()
s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n"
          f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(1)
assert b" 200" in head.split(b"\r\n")[0], head
t = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"]).wrap_socket(s, server_hostname=host)
'''
