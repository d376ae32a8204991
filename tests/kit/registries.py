"""Package registries on 127.0.0.1 standing in for pypi.org, files.pythonhosted.org and
registry.npmjs.org, as pip and npm read them: one package each, envgit-tiny 1.0.0 (a wheel and
an npm tarball built by hand), served by an HTTPSServer whose names the daemon maps to it
(ENVGIT_RESOLVE) and whose CA it trusts (ENVGIT_UPSTREAM_CA)."""

import base64
import gzip
import hashlib
import io
import json
import tarfile
import zipfile

PYPI_NAMES = ("pypi.org", "files.pythonhosted.org")
NPM_NAMES = ("registry.npmjs.org",)


def wheel():
    """A pure-Python wheel, envgit_tiny 1.0.0, built by hand (zip + dist-info)."""
    files = {"envgit_tiny.py": b"VALUE = 42\n",
             "envgit_tiny-1.0.0.dist-info/METADATA":
                 b"Metadata-Version: 2.1\nName: envgit-tiny\nVersion: 1.0.0\n",
             "envgit_tiny-1.0.0.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: envgit-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = ""
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(data)}\n"
    record += "envgit_tiny-1.0.0.dist-info/RECORD,,\n"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("envgit_tiny-1.0.0.dist-info/RECORD", record)
    return out.getvalue()


WHEEL = "envgit_tiny-1.0.0-py3-none-any.whl"


def pypi_app(wheel):
    """pypi.org's simple index and files.pythonhosted.org's files, as pip reads them."""
    sha = hashlib.sha256(wheel).hexdigest()
    href = f"https://files.pythonhosted.org/packages/ab/cd/{WHEEL}#sha256={sha}"

    def app(method, path, headers, body):
        host = headers.get("host", "").split(":")[0]
        if host == "pypi.org" and path.rstrip("/") in ("/simple/envgit-tiny", "/simple/envgit_tiny"):
            page = f'<!DOCTYPE html><html><body><a href="{href}">{WHEEL}</a></body></html>'
            return 200, {"Content-Type": "text/html", "Cache-Control": "max-age=0"}, page.encode()
        if host == "files.pythonhosted.org" and path == f"/packages/ab/cd/{WHEEL}":
            return 200, {"Content-Type": "application/octet-stream",
                         "Cache-Control": "max-age=365000000, immutable, public"}, wheel
        return 404, {"Content-Type": "text/plain"}, b"not here\n"
    return app


def tgz(files) -> bytes:
    """A gzip'd tar of `files` ((name, bytes) pairs), the same bytes every call (gzip's header
    time 0, each member's time 0): a lockfile's integrity or an index's checksum names them."""
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as z, tarfile.open(fileobj=z, mode="w") as t:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def npm_tarball():
    return tgz((("package/package.json", b'{"name": "envgit-tiny", "version": "1.0.0", "main": "index.js"}\n'),
                ("package/index.js", b"module.exports = 42;\n")))


def npm_app(tarball):
    url = "https://registry.npmjs.org/envgit-tiny/-/envgit-tiny-1.0.0.tgz"
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    doc = {"name": "envgit-tiny", "dist-tags": {"latest": "1.0.0"},
           "versions": {"1.0.0": {"name": "envgit-tiny", "version": "1.0.0", "main": "index.js",
                                  "dist": {"tarball": url, "integrity": integrity,
                                           "shasum": hashlib.sha1(tarball).hexdigest()}}}}

    def app(method, path, headers, body):
        if path == "/envgit-tiny":
            return 200, {"Content-Type": "application/json", "Cache-Control": "max-age=300"}, \
                json.dumps(doc).encode()
        if path == "/envgit-tiny/-/envgit-tiny-1.0.0.tgz":
            return 200, {"Content-Type": "application/octet-stream"}, tarball
        return 404, {"Content-Type": "application/json"}, b'{"error": "not found"}'
    return app


def both_app():
    """pypi's and npm's apps behind one server, told apart by the Host header."""
    pypi, npm = pypi_app(wheel()), npm_app(npm_tarball())

    def app(method, path, headers, body):
        host = headers.get("host", "").split(":")[0]
        return (npm if host in NPM_NAMES else pypi)(method, path, headers, body)
    return app


def npm_lock(app_name: str) -> dict:
    """The package-lock.json (lockfile v3) of a project `app_name` depending on envgit-tiny
    ^1.0.0 from the registry above, for `npm ci`."""
    tarball = npm_tarball()
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    return {"name": app_name, "version": "0.0.0", "lockfileVersion": 3, "requires": True,
            "packages": {"": {"name": app_name, "version": "0.0.0",
                              "dependencies": {"envgit-tiny": "^1.0.0"}},
                         "node_modules/envgit-tiny": {
                             "version": "1.0.0", "integrity": integrity,
                             "resolved": "https://registry.npmjs.org/envgit-tiny/-/envgit-tiny-1.0.0.tgz"}}}
