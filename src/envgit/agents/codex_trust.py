"""Trusting envgit's own Codex hook, and no other.

Codex runs a hook only once its content hash is recorded as trusted in config.toml
(`[hooks.state."<key>"] trusted_hash = "sha256:…"`). `--dangerously-bypass-hook-trust`
would also run every untrusted hook a cloned repository brings, on the host, outside the
sandbox: so instead envgit asks Codex itself (`codex app-server`, method `hooks/list`) for
the key and hash of the hook it wrote, and trusts exactly that one, for this run only, with a
`-c` override: config.toml is the person's own (Codex writes their trust decisions there), and
a per-session hook path recorded in it would pile up one stale entry per session.
"""

import json
import os
import subprocess
import threading
from typing import IO, cast

LIST_TIMEOUT_S = 30


class TrustError(Exception):
    pass


def hook_identity(codex: str, env: dict, cwd: str, hooks_file: str) -> tuple[str, str]:
    """(key, currentHash) of the hook defined in `hooks_file`, as Codex computes them."""
    msgs = [{"id": 1, "method": "initialize", "params": {"clientInfo": {"name": "envgit", "version": "1"}}},
            {"method": "initialized"},
            {"id": 2, "method": "hooks/list", "params": {"cwds": [cwd]}}]
    p = subprocess.Popen([codex, "app-server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=env, cwd=cwd)
    # (Popen sets both, as PIPE asked: the casts only tell mypy so)
    stdin, stdout = cast(IO[bytes], p.stdin), cast(IO[bytes], p.stdout)
    timer = threading.Timer(LIST_TIMEOUT_S, p.kill)     # a silent server ends the read loop
    timer.start()
    try:
        stdin.write("".join(json.dumps(m) + "\n" for m in msgs).encode())
        stdin.flush()
        for line in stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("id") != 2:
                continue
            if "error" in msg:
                raise TrustError(f"codex app-server hooks/list: {msg['error'].get('message')}")
            for group in (msg.get("result") or {}).get("data") or []:
                for h in group.get("hooks") or []:
                    if os.path.realpath(h.get("sourcePath") or "") == os.path.realpath(hooks_file):
                        return h["key"], h["currentHash"]
            raise TrustError("codex app-server did not list envgit's hook")
        raise TrustError("codex app-server gave no answer to hooks/list")
    finally:
        timer.cancel()
        p.kill()
        p.wait()


def trust_override(key: str, digest: str) -> list[str]:
    """Codex's arguments trusting that one hook (a TOML inline table: the key holds dots)."""
    return ["-c", f"hooks.state={{{json.dumps(key)} = {{trusted_hash = {json.dumps(digest)}}}}}"]
