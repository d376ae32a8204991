"""Commit signing through the gate, as a step's git sees it: with `signing:` in the policy and
the gate running, git inside signs with SSH (`gpg.format ssh`), its signing program is envgit's
shim (sandbox/ssh_shim.py under the name ssh-keygen, beside envgit's `ssh`) and its signing key
is the policy key's *public* half, given literally (`key::ssh-ed25519 AAAA…`). The shim sends
what git asks it to sign to the gate (proxy/sshsign.py), which signs it with the private key on
the host; the step never reads the key.

Given as git's environment configuration (GIT_CONFIG_COUNT, git 2.31+), which comes after every
config file, so the person's own gpg settings (a program or key the sandbox does not have) give
way to it.
"""

import os
import subprocess

SIGNER_INSIDE = "/run/envgit/bin/ssh-keygen"
_PUBLIC: dict[tuple, str | None] = {}       # (path, mtime_ns) -> the public key line


def key_path(signing: dict, home: str | None = None) -> str:
    """The policy's key as a host path ('~/' is the person's home)."""
    key = str(signing.get("key") or "")
    if key.startswith("~/"):
        key = os.path.join(home or os.path.expanduser("~"), key[2:])
    return key


def public_key(path: str) -> str | None:
    """The public key line of the key at `path` (the file itself when it is a .pub, else its
    .pub beside it, else derived with ssh-keygen -y: a key without a passphrase); None if none."""
    for candidate in ((path,) if path.endswith(".pub") else (path + ".pub", path)):
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        cached = _PUBLIC.get((candidate, st.st_mtime_ns))
        if cached:
            return cached
        line = None
        if candidate.endswith(".pub"):
            try:
                with open(candidate, encoding="utf-8", errors="replace") as f:
                    line = f.readline().strip()
            except OSError:
                line = None
        else:
            try:
                r = subprocess.run(["ssh-keygen", "-y", "-f", candidate], capture_output=True, text=True,
                                   stdin=subprocess.DEVNULL, timeout=10)
                line = r.stdout.strip() if r.returncode == 0 else None
            except (OSError, subprocess.TimeoutExpired):
                line = None
        if line and line.startswith(("ssh-", "ecdsa-", "sk-")) and "\n" not in line:
            _PUBLIC[(candidate, st.st_mtime_ns)] = " ".join(line.split()[:2])
            return _PUBLIC[(candidate, st.st_mtime_ns)]
    return None


def git_environment(env: dict, public: str) -> dict:
    """The variables that make git inside sign through the gate, after any `env` already has."""
    try:
        n = int(env.get("GIT_CONFIG_COUNT") or 0)
    except ValueError:
        n = 0
    out = {}
    for i, (k, v) in enumerate((("gpg.format", "ssh"), ("gpg.ssh.program", SIGNER_INSIDE),
                                ("user.signingkey", f"key::{public}")), start=n):
        out[f"GIT_CONFIG_KEY_{i}"], out[f"GIT_CONFIG_VALUE_{i}"] = k, v
    out["GIT_CONFIG_COUNT"] = str(n + 3)
    return out
