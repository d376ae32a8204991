"""Local HTTPS servers for `envgit demo` and the tests, on 127.0.0.1 only, with a CA of their own.

    with GitServer() as git:               # git http-backend behind TLS, receive-pack enabled
        git.url                            # https://git.example.test:PORT/repo.git
        git.resolve                        # "git.example.test=127.0.0.1" for ENVGIT_RESOLVE
        git.ca.cert_path                   # the test CA (ENVGIT_UPSTREAM_CA, GIT_SSL_CAINFO)
        git.refs()                         # {"refs/heads/main": "<sha>"} read on the server side
        git.log                            # [(method, path?query, status), ...]

    with HTTPSServer(app, names=("registry.example.test",)) as srv:   # any stub
        app(method, path, headers, body) -> (status, headers_dict, body_bytes)

The bare repository has one commit on main. Request bodies may be chunked or gzip'ed
(git sends both); the CGI gets them as git http-backend expects.
"""

import datetime
import ipaddress
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


class TestCA:
    """A throwaway CA and server certificates signed by it (written under `root`)."""
    __test__ = False

    def __init__(self, root: Path, name="envgit test CA"):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(days=1))
                     .not_valid_after(now + datetime.timedelta(days=30))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                     .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                                  False, False), critical=True)
                     .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()),
                                    critical=False)
                     .sign(self.key, hashes.SHA256()))
        self.cert_path = self.root / "test-ca.pem"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, names, stem="server") -> tuple[Path, Path]:
        """(cert file, key file) for `names` (DNS names and IP addresses)."""
        key = ec.generate_private_key(ec.SECP256R1())
        alt: list[x509.GeneralName] = []
        for n in names:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(n)))
            except ValueError:
                alt.append(x509.DNSName(n))
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
                .issuer_name(self.cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=30))
                .add_extension(x509.SubjectAlternativeName(alt), critical=False)
                .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                               critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                               critical=False)
                .sign(self.key, hashes.SHA256()))
        cert_path, key_path = self.root / f"{stem}.pem", self.root / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        os.chmod(key_path, 0o600)
        return cert_path, key_path


def _read_body(handler) -> bytes:
    if "chunked" in handler.headers.get("Transfer-Encoding", "").lower():
        out = bytearray()
        for _ in range(1 << 20):
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(out)
            out += handler.rfile.read(size)
            handler.rfile.readline()
        raise ValueError("too many chunks")
    n = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(n) if n else b""


def serve_in_background(httpd):
    """Serve an http.server from a daemon thread (stop() ends it); returns the server."""
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    return httpd


def stop(httpd):
    httpd.shutdown()
    httpd.server_close()


class HTTPSServer:
    """A threaded HTTPS/1.1 server on 127.0.0.1 calling `app` for each request."""

    def __init__(self, app, names=("stub.example.test",), root: Path | None = None, ca: TestCA | None = None):
        self.app, self.names = app, tuple(names)
        self._own_root = root is None
        self.root = Path(root or tempfile.mkdtemp(prefix="envgit-https-"))
        self.ca = ca or TestCA(self.root / "ca")
        self.log: list[tuple[str, str, int]] = []
        self.requests: list[dict] = []

    @property
    def resolve(self) -> str:
        return ",".join(f"{n}=127.0.0.1" for n in self.names)

    def url_for(self, name=None) -> str:
        return f"https://{name or self.names[0]}:{self.port}"

    def __enter__(self):
        cert, key = self.ca.issue(list(self.names) + ["localhost", "127.0.0.1"])
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        ctx.set_alpn_protocols(["http/1.1"])
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _any(self):
                body = _read_body(self)
                headers = {k.lower(): v for k, v in self.headers.items()}
                outer.requests.append({"method": self.command, "path": self.path,
                                       "headers": headers, "body": body})
                status, rheaders, rbody = outer.app(self.command, self.path, headers, body)
                outer.log.append((self.command, self.path, status))
                self.send_response(status)
                for k, v in rheaders.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(rbody)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(rbody)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _any

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def get_request(self):
                sock, addr = super().get_request()
                return ctx.wrap_socket(sock, server_side=True), addr

        self.httpd = serve_in_background(Server(("127.0.0.1", 0), Handler))
        self.port = self.httpd.server_address[1]
        return self

    def __exit__(self, *exc):
        stop(self.httpd)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)


def _git(*args, cwd=None, env=None):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", **(env or {})},
                          timeout=60).stdout


class GitServer(HTTPSServer):
    """`git http-backend` over HTTPS, with receive-pack (push) enabled and no auth."""

    def __init__(self, names=("git.example.test",), repo="repo.git", root: Path | None = None):
        super().__init__(self._cgi, names, root)
        self.repo_name = repo
        self.projects = self.root / "srv"
        self.bare = self.projects / repo

    @property
    def url(self) -> str:
        return f"{self.url_for()}/{self.repo_name}"

    def __enter__(self):
        self.projects.mkdir(parents=True, exist_ok=True)
        _git("init", "-q", "--bare", "-b", "main", str(self.bare))
        _git("config", "http.receivepack", "true", cwd=self.bare)
        seed = self.root / "seed"
        ident = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.test",
                 "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.test"}
        _git("init", "-q", "-b", "main", str(seed))
        (seed / "README").write_text("hello\n")
        _git("add", "README", cwd=seed)
        _git("commit", "-q", "-m", "initial", cwd=seed, env=ident)
        _git("push", "-q", str(self.bare), "main", cwd=seed)
        return super().__enter__()

    def refs(self) -> dict[str, str]:
        out = _git("for-each-ref", "--format=%(refname) %(objectname)", cwd=self.bare)
        return dict(line.split(" ") for line in out.splitlines())

    def _cgi(self, method, path, headers, body):
        path_info, _, query = path.partition("?")
        env = {"PATH": os.environ["PATH"], "GIT_PROJECT_ROOT": str(self.projects),
               "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": method, "PATH_INFO": path_info,
               "QUERY_STRING": query, "CONTENT_TYPE": headers.get("content-type", ""),
               "CONTENT_LENGTH": str(len(body)), "REMOTE_ADDR": "127.0.0.1",
               "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(self.root)}
        for name in ("content-encoding", "git-protocol"):
            if name in headers:
                env["HTTP_" + name.upper().replace("-", "_")] = headers[name]
        r = subprocess.run(["git", "http-backend"], input=body, capture_output=True, env=env, timeout=60)
        head, _, out = r.stdout.partition(b"\r\n\r\n")
        status, rheaders = 200, {}
        for line in head.decode("latin-1").split("\r\n"):
            k, _, v = line.partition(":")
            if k.lower() == "status":
                status = int(v.split()[0])
            elif k:
                rheaders[k] = v.strip()
        return status, rheaders, out
