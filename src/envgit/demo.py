"""`envgit demo`: a scripted agent against a git remote served on 127.0.0.1 over HTTPS.

The push is denied at the request, the agent destroys its own history beyond git's reach,
and `envgit rewind` brings the commit back. Every claim printed at the end is checked against
the real state first: the server's refs and request log, `git cat-file` of the commit, the
journal. A claim that does not hold makes the demo exit 1 naming it; nothing is printed as
done that was not verified.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GREETING = "console.log('hello, ' + (process.argv[2] ?? 'world'))\n"
RELEASE = """#!/bin/sh
# release: publish main to the remote (the command is in a variable, as scripts do)
g=git
$g push origin main
"""


class ClaimFailed(Exception):
    pass


class Out:
    """Step headers and colour on a terminal, plain text in a pipe, JSON lines with --json."""

    def __init__(self, as_json):
        self.json = as_json
        self.color = sys.stdout.isatty() and not as_json and "NO_COLOR" not in os.environ

    def _c(self, code, text):
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def head(self, text):
        if not self.json:
            print("\n" + self._c("1;36", f"== {text}"))

    def line(self, text=""):
        if not self.json:
            print(text)

    def cmd(self, text):
        if not self.json:
            print(self._c("2", f"$ {text}"))

    def ok(self, text):
        if not self.json:
            print(self._c("32", "ok  ") + text)

    def record(self, obj):
        if self.json:
            print(json.dumps(obj), flush=True)


def _envgit():
    return [sys.executable, "-m", "envgit"]


def main(args) -> int:
    from .doctor import run_checks
    out = Out(args.json)
    missing = [c for c in run_checks() if c.required and not c.ok]
    if missing:
        for c in missing:
            print(f"envgit demo: cannot run here: {c.name}: {c.detail}\n  fix: {c.fix}", file=sys.stderr)
        return 1
    started = time.monotonic()
    work = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="envgit-demo-"))
    if args.keep:
        if work.exists() and any(work.iterdir()):
            print(f"envgit demo: {work} is not empty; give --keep a new or empty directory", file=sys.stderr)
            return 2
        work.mkdir(parents=True, exist_ok=True)
    from .localhttps import GitServer
    server = GitServer(names=("git.demo.test",), repo="app.git", root=work / "remote")
    try:
        with server:
            demo = Demo(work, server, out, args.policy)
            try:
                demo.run()
            except ClaimFailed as e:
                print(f"envgit demo: FAILED: {e}", file=sys.stderr)
                out.record({"result": "failed", "claim": str(e)})
                return 1
            finally:
                demo.envgit("daemon", "stop")
        secs = time.monotonic() - started
        out.line(f"\ndemo finished in {secs:.1f} s" + (f"; the project is in {demo.app}" if args.keep else ""))
        out.record({"result": "ok", "seconds": round(secs, 2)})
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


class Demo:
    def __init__(self, work: Path, server, out: Out, policy_file):
        self.work, self.server, self.out = work, server, out
        self.app = work / "app"
        self.policy_file = policy_file
        hostport = server.url.split("/")[2]
        self.hostport = hostport
        self.env = {**os.environ, "HOME": str(work / "home"), "ENVGIT_RESOLVE": server.resolve,
                    "ENVGIT_UPSTREAM_CA": str(server.ca.cert_path), "GIT_TERMINAL_PROMPT": "0",
                    "GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@demo.test",
                    "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "agent@demo.test",
                    "ENVGIT_DAEMON_IDLE": "60"}
        for k in ("GIT_SSL_CAINFO", "SSL_CERT_FILE", "CURL_CA_BUNDLE"):
            self.env.pop(k, None)
        (work / "home").mkdir(exist_ok=True)

    # --- helpers ----------------------------------------------------------------------

    def sh(self, *argv, check=True, cwd=None, env=None):
        r = subprocess.run(list(argv), cwd=cwd or self.app, env={**self.env, **(env or {})},
                           capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise ClaimFailed(f"set-up command failed: {' '.join(argv)}: {r.stderr.strip()}")
        return r

    def git(self, *args, check=True):
        return self.sh("git", *args, check=check)

    def envgit(self, *args):
        return self.sh(*_envgit(), *args, check=False)

    def step(self, title, script):
        self.out.head(f"agent: {title}")
        self.out.cmd(f"envgit run -- sh -c {script!r}" if "\n" not in script else "envgit run -- sh -c '…'")
        r = self.envgit("run", "--", "sh", "-c", script)
        for line in (r.stdout + r.stderr).rstrip().splitlines():
            self.out.line("   " + line)
        s = json.loads(self.envgit("log", "--json").stdout)[-1]
        self.out.record({"step": s["id"], "title": title, "exit_code": s["exit_code"], "marks": s["marks"],
                         "requests": [{k: q.get(k) for k in ("method", "host", "path", "decision", "rule")}
                                      for q in s["requests"]],
                         "snapshot": (s.get("snapshot") or {}).get("tree")})
        return r, s

    def claim(self, cond, text):
        if not cond:
            raise ClaimFailed(text)

    # --- the story --------------------------------------------------------------------

    def run(self):
        o = self.out
        o.head("set-up: a git remote on 127.0.0.1 (git http-backend over HTTPS, push enabled)")
        self.sh("git", "-c", f"http.curloptResolve={self.hostport}:127.0.0.1", "clone", "-q",
                self.server.url, str(self.app), cwd=self.work, env={"GIT_SSL_CAINFO": str(self.server.ca.cert_path)})
        self.git("config", "user.name", "agent")        # the sandbox passes no GIT_* variables
        self.git("config", "user.email", "agent@demo.test")
        (self.app / "release.sh").write_text(RELEASE)
        self.git("add", "release.sh")
        self.git("commit", "-qm", "Add release script")
        self.sh("git", "-c", f"http.curloptResolve={self.hostport}:127.0.0.1", "push", "-q", "origin", "main",
                env={"GIT_SSL_CAINFO": str(self.server.ca.cert_path)})
        remote_main = self.server.refs()["refs/heads/main"]
        o.line(f"   remote {self.server.url}  main = {remote_main[:12]}")
        init = self.envgit("init")
        self.claim(init.returncode == 0, f"envgit init works ({init.stderr.strip()})")
        # --policy FILE: `{remote}` in it stands for the demo remote's host:port
        policy = Path(self.policy_file).read_text().replace("{remote}", self.hostport) if self.policy_file \
            else f'version: 1\nnetwork:\n  allow: ["{self.hostport}"]\nirreversible:\n  - preset: default\n'
        (self.app / "envgit.yaml").write_text(policy)
        o.line("   envgit.yaml: network.allow the remote; irreversible: preset default (git push denied)")

        r1, s1 = self.step("write a greeting", f"cat > greet.js <<'EOF'\n{GREETING}EOF")
        self.claim(s1["exit_code"] == 0 and (self.app / "greet.js").read_text() == GREETING,
                   "step 1 wrote greet.js")
        r2, s2 = self.step("commit it", "git add greet.js && git commit -qm 'Add greeting' && git log --oneline -1")
        self.claim(s2["exit_code"] == 0, f"step 2 committed ({r2.stderr.strip()})")
        commit = self.git("rev-parse", "HEAD").stdout.strip()

        seen_before = len(self.server.log)
        r3, s3 = self.step("release it", "sh release.sh")
        remote_log = self.server.log[seen_before:]
        o.line("   what the remote saw:")
        for method, path, status in remote_log:
            o.line(f"     {method} {path} -> {status}")
        self.claim(self.server.refs()["refs/heads/main"] == remote_main,
                   f"the remote's main is unchanged (it is {self.server.refs()['refs/heads/main'][:12]}, "
                   f"was {remote_main[:12]}): the push was not stopped")
        self.claim(not any(m == "POST" and "receive-pack" in p for m, p, _ in remote_log),
                   "the pack never reached the remote (its log has POST git-receive-pack)")
        self.claim(any(m == "GET" and "service=git-receive-pack" in p for m, p, _ in remote_log),
                   "the ref advertisement went through "
                   "(the remote's log has no GET info/refs?service=git-receive-pack)")
        denied = [q for q in s3["requests"] if q["method"] == "POST" and "receive-pack" in q["path"]
                  and q["decision"] == "deny"]
        self.claim(denied and s3["exit_code"] != 0, "step 3's push was denied at the request, on the step")
        self.claim("[remote rejected]" in r3.stderr, "git told the agent '[remote rejected] … (reason)'")

        r4, s4 = self.step("the push failed, so throw the work away, history and all",
                           "git reset -q --hard HEAD~1 && git reflog expire --expire=now --all "
                           "&& git gc -q --prune=now")
        gone = self.git("cat-file", "-e", commit, check=False).returncode != 0
        o.line(f"   git cat-file -e {commit[:12]}: {'missing' if gone else 'still there'}")
        self.claim(gone and not (self.app / "greet.js").exists(), "step 4 destroyed the commit beyond git's reach")

        o.head("envgit rewind 2")
        o.cmd("envgit rewind 2 --yes")
        rw = self.envgit("rewind", "2", "--yes")
        o.line("   " + (rw.stdout.strip().splitlines() or [""])[-1])
        self.claim(rw.returncode == 0, f"envgit rewind 2 succeeded ({rw.stderr.strip()})")
        o.cmd("git log --oneline")
        log = self.git("log", "--oneline").stdout
        for line in log.splitlines():
            o.line("   " + line)
        o.cmd("cat greet.js")
        greet = self.app / "greet.js"
        o.line("   " + greet.read_text().rstrip() if greet.exists() else "   (missing)")
        kind = self.git("cat-file", "-t", commit, check=False).stdout.strip()
        self.claim(kind == "commit" and log.startswith(commit[:7]),
                   f"the commit {commit[:12]} is back (git cat-file -t says {kind or 'nothing'})")
        self.claim((self.app / "greet.js").read_text() == GREETING, "greet.js is back as step 1 wrote it")

        o.head("envgit log")
        for line in self.envgit("log").stdout.rstrip().splitlines():
            o.line("   " + line)
        steps = json.loads(self.envgit("log", "--json").stdout)
        fsck = self.envgit("fsck")
        self.claim(len(steps) == 5 and fsck.returncode == 0,
                   f"the journal holds the 5 steps and its chain verifies ({fsck.stdout.strip()})")
        o.head("what was proven")
        o.ok(f"audit:  {len(steps)} steps recorded, each with its command, exit, snapshot and requests; "
             "envgit fsck verifies the chain")
        o.ok(f"gate:   step {s3['id']} denied POST {denied[0]['host']}{denied[0]['path']} by rule "
             f"{denied[0]['rule']}; the remote's main is still {remote_main[:12]} and its log has no pack")
        o.ok(f"rewind: commit {commit[:12]} recovered after reset + reflog expire + gc (step {steps[-1]['id']})")
        self.out.record({"claims": {"audit": len(steps), "gate": denied[0]["rule"], "remote_main": remote_main,
                                    "recovered": commit}})
