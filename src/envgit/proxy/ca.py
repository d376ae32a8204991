"""Certificates: the session CA the gate signs intercepted hosts' certificates with, the trust
directory the sandbox sees in place of /etc/ssl/certs, and the roots the gate verifies
upstream servers against.

The CA is made here, in mitmproxy's own file layout (in `state_dir/ca`, the key file 0600 in a
0700 directory), which mitmproxy's certificate store then loads; only its certificate ever
leaves that directory. Its key is ECDSA P-256, not the RSA-2048 mitmproxy would make: making
one costs ~0.3 ms instead of 60 ms or more, loading it at every gate start 0.1 ms instead of
36 (cryptography checks an RSA key as it loads it), and every certificate the gate makes and
every handshake it answers is signed with it. A project whose CA was made before keeps it.
"""

import os
import shutil
import subprocess
from pathlib import Path

BASENAME = "mitmproxy"                       # mitmproxy's file names inside the CA directory
SESSION_CA_NAME = "envgit-session-ca.pem"
SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                  "/etc/ssl/cert.pem")
BUNDLE_NAME = "ca-certificates.crt"          # the name Debian's tools and most clients look for
FINGERPRINT_NAME = ".envgit-made-from"        # in a trust directory: what it was made from


def ca_dir(state_dir: Path) -> Path:
    d = state_dir / "ca"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    return d


def make_session_ca(confdir: Path, days: int = 3650) -> None:
    """The session CA in `confdir` as mitmproxy's store reads it (`mitmproxy-ca.pem`: key then
    certificate; `mitmproxy-ca-cert.pem`: the certificate), unless one is there. Written whole
    and renamed into place, the certificate last: a crash leaves no half CA to load."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key_file, cert_file = confdir / f"{BASENAME}-ca.pem", confdir / f"{BASENAME}-ca-cert.pem"
    if key_file.is_file() and cert_file.is_file():
        return
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "envgit session CA"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "envgit")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .serial_number(x509.random_serial_number()).public_key(key.public_key())
            .not_valid_before(now - datetime.timedelta(days=2))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True, crl_sign=True,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    secret = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                               serialization.NoEncryption()) + pem
    for path, data, mode in ((key_file, secret, 0o600), (cert_file, pem, 0o644)):
        tmp = path.with_name(path.name + ".tmp")
        try:                        # a crash's leftover: made anew, never written through
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)


def ca_cert_path(state_dir: Path) -> Path:
    return state_dir / "ca" / f"{BASENAME}-ca-cert.pem"


def system_bundle() -> Path | None:
    for p in SYSTEM_BUNDLES:
        if os.path.isfile(p):
            return Path(p)
    try:
        import certifi
        return Path(certifi.where())
    except ImportError:
        return None


def upstream_bundle(state_dir: Path, extra: Path | None) -> Path:
    """The roots upstream servers are verified against: the system's (not mitmproxy's certifi
    copy, so a machine's own roots keep working) plus `extra` (a test server's CA)."""
    out = state_dir / "upstream-ca.pem"
    parts = []
    base = system_bundle()
    if base:
        parts.append(base.read_bytes())
    if extra:
        parts.append(Path(extra).read_bytes())
    out.write_bytes(b"\n".join(parts))
    return out


def trust_dir(state_dir: Path, system_certs: str = "/etc/ssl/certs", extra: Path | None = None) -> Path:
    """A copy of `system_certs` (links kept as links) with the session CA added, the bundle
    file extended by it, and the hash links regenerated: bind-mounted over /etc/ssl/certs in
    the sandbox, so tunnelled hosts (real certificates) and intercepted ones (the session CA)
    both verify there, and only there. `extra` (ENVGIT_UPSTREAM_CA, test-only: the local test
    servers' CA) is trusted there too, as the client itself verifies a tunnelled host."""
    src, out = Path(system_certs), state_dir / "trust" / "certs"
    session = ca_cert_path(state_dir).read_bytes()
    mark = _fingerprint(src, session, extra)
    try:        # made by an earlier session from the same CA and system roots: as it is
        if (out / FINGERPRINT_NAME).read_text() == mark:
            return out
    except OSError:
        pass
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    bundle = b""
    if src.is_dir():
        for entry in os.scandir(src):
            target = out / entry.name
            if entry.name == BUNDLE_NAME:
                bundle = Path(entry.path).read_bytes()
            elif entry.is_symlink():
                os.symlink(os.readlink(entry.path), target)
            elif entry.is_file():
                shutil.copyfile(entry.path, target)
    if not bundle and (base := system_bundle()):
        bundle = base.read_bytes()
    added = session + (b"\n" + Path(extra).read_bytes() if extra else b"")
    (out / BUNDLE_NAME).write_bytes(bundle.rstrip(b"\n") + b"\n" + added)
    (out / SESSION_CA_NAME).write_bytes(session)
    if extra:
        (out / "envgit-upstream-test-ca.pem").write_bytes(Path(extra).read_bytes())
    _rehash(out)
    (out / FINGERPRINT_NAME).write_text(mark)      # last: a directory half made is made again
    return out


def _fingerprint(src: Path, session: bytes, extra: Path | None) -> str:
    """What a trust directory is made from: the session CA, the extra root, and each entry of
    the system's certs directory with its size and time (a root added or updated by the
    system's ca-certificates changes it)."""
    import hashlib
    h = hashlib.sha256(session + b"\0" + (Path(extra).read_bytes() if extra else b""))
    if src.is_dir():
        for entry in sorted(os.scandir(src), key=lambda e: e.name):
            st = entry.stat(follow_symlinks=True) if not entry.is_symlink() else entry.stat(follow_symlinks=False)
            link = os.readlink(entry.path) if entry.is_symlink() else ""
            h.update(f"{entry.name}\0{link}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _rehash(d: Path) -> None:
    # The <subject-hash>.0 links OpenSSL's directory lookup (CApath) uses.
    # from a trusted system directory, never PATH (an activated project venv's bin/ is first)
    from ..sandbox.launch import LaunchError, trusted_binary
    for tool in (["openssl", "rehash", str(d)], ["c_rehash", str(d)]):
        try:
            tool[0] = trusted_binary(tool[0])
        except LaunchError:
            continue
        if tool[0]:
            r = subprocess.run(tool, capture_output=True, timeout=60)
            if r.returncode == 0:
                return
    raise RuntimeError("neither `openssl rehash` nor `c_rehash` is available to index "
                       f"{d}; install openssl")
