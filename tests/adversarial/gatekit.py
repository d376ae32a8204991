"""What the network-gate attacks share: local HTTPS servers (a git http-backend and a stub that
records every request it receives) on 127.0.0.1, and an attacker's project whose daemon maps
their names there and trusts their CA.

    with servers() as (git, stub):
        net = netproject(attacker, git, stub, policy_tail)   # writes envgit.yaml, clones nothing
        attacker.run("curl …")                               # through the real gate
        stub.requests                                        # the oracle: what reached the server

The servers' files live in a world-readable directory: the daemon of the unprivileged
attacker must read their CA.
"""

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from gitserver import GitServer, HTTPSServer

STUB_NAMES = ("api.github.com", "gitlab.com", "stub.example.test", "gql.example.test",
              "upload.pypi.org")


def _ok(method, path, headers, body):
    return 200, {"Content-Type": "application/json"}, b'{"data": {}}'


@contextlib.contextmanager
def servers(app=_ok):
    base = Path(tempfile.mkdtemp(prefix="envgit-adv-srv-"))
    os.chmod(base, 0o755)
    try:
        with GitServer(root=base / "git") as git, \
                HTTPSServer(app, STUB_NAMES, root=base / "stub", ca=git.ca) as stub:
            for d in (base / "git", base / "git" / "ca"):
                os.chmod(d, 0o755)
            yield git, stub
    finally:
        shutil.rmtree(base, ignore_errors=True)


def hostport(srv, name=None):
    return f"{name or srv.names[0]}:{srv.port}"


def netproject(attacker, git, stub, tail="", allow=(), trust=True):
    """The attacker's project with the network on: both servers allowed, `tail` appended to
    the policy (its own `irreversible:` list etc.), the daemon started afresh with the names
    mapped to 127.0.0.1 and the servers' CA trusted upstream. A credential or MCP server in
    `tail` is approved as the person would (`envgit trust --yes`) unless `trust` is False."""
    attacker.stop()
    attacker.env["ENVGIT_RESOLVE"] = ",".join(f"{n}=127.0.0.1" for n in git.names + stub.names)
    attacker.env["ENVGIT_UPSTREAM_CA"] = str(git.ca.cert_path)
    hosts = [hostport(git)] + [hostport(stub, n) for n in stub.names] + list(allow)
    attacker.write_policy("version: 1\nnetwork:\n  ask_timeout: 20\n  allow: [" +
                          ", ".join(f'"{h}"' for h in hosts) + "]\n" + tail)
    if trust and ("credentials:" in tail or "mcp:" in tail):
        trust_policy(attacker)
    return attacker


def trust_policy(attacker):
    """`envgit trust --yes`, as the person approves what the project's envgit.yaml reads and
    sends. runuser gives the test user its passwd home, which does not exist: the approvals go
    in the test home instead, as a person with such a home would say (XDG_STATE_HOME)."""
    attacker.env.setdefault("XDG_STATE_HOME", str(attacker.home / ".local" / "state"))
    attacker.envgit("trust", "--yes", check=True)


def clone_into_project(attacker, git):
    """The attacker's project gets the git server's repository as `origin` (fetched outside,
    as the person set it up), with an identity to commit with."""
    hp = hostport(git)
    r = attacker.host(
        f"git remote add origin {git.url} && "
        f"git -c http.curloptResolve={hp}:127.0.0.1 fetch -q origin && "
        "git reset -q --hard origin/main && git branch -q -u origin/main && "
        "git config user.email a@example.test && git config user.name attacker",
        env={"GIT_SSL_CAINFO": str(git.ca.cert_path), "GIT_TERMINAL_PROMPT": "0",
             "GIT_CONFIG_NOSYSTEM": "1"})
    assert r.returncode == 0, r.stderr


class Answerer:
    """A person at another terminal: answers each question of the attacker's daemon with
    `envgit approve` or `envgit deny` as `decide(question) -> "approve" | "deny"` says, and
    keeps every question it saw."""

    def __init__(self, attacker, decide):
        self.attacker, self.decide, self.seen = attacker, decide, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)

    def _run(self):
        answered = set()
        while not self._stop.is_set():
            r = self.attacker.envgit("pending", "--json")
            try:
                asks = json.loads(r.stdout or "[]")
            except ValueError:
                asks = []
            for a in asks:
                if a["id"] in answered:
                    continue
                answered.add(a["id"])
                self.seen.append(a["question"])
                self.attacker.envgit(self.decide(a["question"]), str(a["id"]))
            time.sleep(0.1)


def refs_of(question):
    return [r["ref"] for r in question.get("refs") or []]
