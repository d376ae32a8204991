"""Red team: Copilot CLI's own file tools (view, grep, create, edit) under `envgit copilot`.

They run in Copilot's process, on the host, unsandboxed; the only guard is the preToolUse hook
(agents/copilot_hook.py, agents/pathcheck.py), which judges the path before the tool opens it.
Two holes found there:

1. The path was judged by its name: a step plants `proj/link -> ~/.ssh/id_ed25519` (or a
   directory link to ~/.ssh), `view proj/link` is a project path, allowed, and the host opens
   the secret through the link; `create`/`edit` write through it.
2. A path under /tmp was judged as "the per-session /tmp" (writable), but the host's /tmp is not
   what a step sees (its /tmp is a private directory of its own): Copilot reads what another
   user planted there, and writes on the host outside the project.

Copilot is driven by its hook's real protocol (the event JSON on stdin, the decision on
stdout); where the hook lets a tool through, the test does what Copilot's tool would do, as
the person, on the host. The oracle: the canary secret (never in what was read, never changed)
and marker files.
"""

import json
import os
import shlex
import sys
import uuid

import pytest

from conftest import CANARY

pytestmark = pytest.mark.both_uids(
    "Copilot's tools open host paths as the person, with the person's DAC: the symlink and /tmp checks must "
    "hold for root and for a normal user; not sure the uid can change them, kept for safety")

SESSION = "copilot-redteam"


def hook(attacker, tool, args):
    """Copilot's preToolUse call: the event on stdin; the hook's stdout (a decision or nothing)."""
    event = {"toolName": tool, "toolArgs": args, "cwd": str(attacker.root), "sessionId": "s"}
    argv = [sys.executable, "-P", "-m", "envgit.agents.copilot_hook", "--project", str(attacker.root),
            "--session", SESSION, "pre"]
    r = attacker.host(shlex.join(argv) + " <<'EOF'\n" + json.dumps(event) + "\nEOF\n")
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr


def denied(out):
    return '"permissionDecision": "deny"' in out


def as_copilot(attacker, tool, args):
    """What Copilot's tool does when the hook lets it run: on the host, as the person."""
    path = args["path"]
    if tool == "view":
        return attacker.host(f"cat {shlex.quote(path)} 2>&1 || ls -la {shlex.quote(path)}").stdout
    if tool == "grep":
        return attacker.host(f"grep -r -- {shlex.quote(args['pattern'])} {shlex.quote(path)}").stdout
    if tool == "create":
        code = f"open({path!r}, 'w').write({args['file_text']!r})"
    else:
        code = (f"p = {path!r}; s = open(p).read(); "
                f"open(p, 'w').write(s.replace({args['old_str']!r}, {args['new_str']!r}))")
    r = attacker.host(f"python3 -c {shlex.quote(code)}")
    return r.stdout + r.stderr


def test_a_symlink_a_step_plants_does_not_lead_copilots_file_tools_to_a_secret(attacker):
    home, root = attacker.home, attacker.root
    key = home / ".ssh" / "id_ed25519"
    r = attacker.envgit("run", "--", "sh", "-c",
                        f"ln -s {key} key.txt && ln -s {home / '.ssh'} keys && "
                        f"ln -s {home / '.aws' / 'credentials'} notes.md && echo planted")
    assert "planted" in r.stdout, r.stdout + r.stderr
    cases = [
        ("view", {"path": str(root / "key.txt")}),
        ("view", {"path": "keys/id_ed25519"}),
        ("view", {"path": str(root / "keys")}),
        ("grep", {"pattern": CANARY[:12], "path": str(root / "keys")}),
        ("grep", {"pattern": CANARY[:12], "path": "key.txt"}),
        ("edit", {"path": str(root / "notes.md"), "old_str": CANARY, "new_str": "edited"}),
        ("create", {"path": str(root / "key.txt"), "file_text": "overwritten\n"}),
        ("create", {"path": str(root / "keys" / "authorized_keys"), "file_text": "ssh-ed25519 AAAA planted\n"}),
    ]
    leaks = []
    for tool, args in cases:
        out = hook(attacker, tool, args)
        if CANARY in out:
            leaks.append(f"{tool} {args['path']}: the canary is in the hook's output")
        if denied(out):
            continue
        got = as_copilot(attacker, tool, args)
        if CANARY in got:
            leaks.append(f"{tool} {args['path']}: allowed, and it read the secret")
        else:
            leaks.append(f"{tool} {args['path']}: allowed through a link to a denied path")
    assert key.read_text() == CANARY + "\n", "the secret was overwritten through the planted link"
    assert CANARY in (home / ".aws" / "credentials").read_text(), "the secret was edited through the link"
    assert not (home / ".ssh" / "authorized_keys").exists(), "a file was created in ~/.ssh through the link"
    assert not leaks, leaks


def test_copilots_file_tools_do_not_take_the_hosts_tmp_for_the_steps(attacker):
    """A step's /tmp is its own (a private directory, gone with the step): the host's /tmp
    holds what other users put there. A file tool on host /tmp is refused, with the reason."""
    tag = uuid.uuid4().hex[:8]
    planted = f"/tmp/envgit-planted-{tag}"
    with open(planted, "w") as f:          # another user's file in the host's shared /tmp
        f.write(f"PLANTED {CANARY}\n")
    os.chmod(planted, 0o644)
    made = f"/tmp/envgit-made-{tag}"
    try:
        r = attacker.envgit("run", "--", "sh", "-c", f"echo step > {made} && echo wrote")
        assert "wrote" in r.stdout, r.stdout + r.stderr
        assert not os.path.exists(made), "the step's /tmp is the host's"      # the premise
        problems = []
        for tool, args in [("view", {"path": planted}),
                           ("grep", {"pattern": "PLANTED", "path": "/tmp"}),
                           ("view", {"path": made}),
                           ("create", {"path": made, "file_text": "from copilot\n"}),
                           ("edit", {"path": planted, "old_str": "PLANTED", "new_str": "x"})]:
            out = hook(attacker, tool, args)
            if CANARY in out:
                problems.append(f"{tool} {args['path']}: the canary is in the hook's output")
            if denied(out):
                if "/tmp" not in out:
                    problems.append(f"{tool} {args['path']}: denied without saying why: {out}")
                continue
            got = as_copilot(attacker, tool, args)
            problems.append(f"{tool} {args['path']}: allowed on the host's /tmp"
                            + (" and it read the planted file" if CANARY in got else ""))
        assert not os.path.exists(made), "create wrote into the host's /tmp"
        assert not problems, problems
    finally:
        for p in (planted, made):
            if os.path.lexists(p):
                os.unlink(p)
