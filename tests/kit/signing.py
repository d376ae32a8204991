"""A project whose policy signs commits at the gate (proxy/sshsign.py): an SSH key in the
home, git's identity, an allowed-signers file for verifying outside, and the policy."""

import json
import subprocess

from conftest import CANARY

POLICY = ('version: 1\nnetwork:\n  allow: ["example.test"]\n'
          'signing:\n  key: ~/.ssh/signing_key\n')


def make_signer(env, policy_extra=""):
    """`env` (an Env or an adversarial Attacker) set up to sign; env.key, env.allowed set."""
    key = env.home / ".ssh" / "signing_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{CANARY}@example", "-f", str(key)],
                   check=True)
    for k, v in (("user.email", "me@example"), ("user.name", "Me")):
        subprocess.run(["git", "-C", str(env.root), "-c", "safe.directory=*", "config", k, v], check=True)
    allowed = env.home / "allowed_signers"
    allowed.write_text(f"me@example {(env.home / '.ssh' / 'signing_key.pub').read_text()}")
    policy = POLICY
    if getattr(env, "user", None):
        # runuser gives the test user its passwd home, not the test's: the key is named by its
        # path (outside the project, so outside the step's view too), the approvals kept
        # where that user can write, and a daemon started now sees both
        state = env.home / ".local" / "state"
        state.mkdir(parents=True, exist_ok=True)
        env.env["XDG_STATE_HOME"] = str(state)
        env.own(env.home / ".local")
        policy = policy.replace("~/.ssh/signing_key", str(key))
        env.envgit("daemon", "stop")
    if hasattr(env, "own"):
        env.own(key, key.with_suffix(".pub"), allowed, env.root / ".git")
    env.write_policy(policy + policy_extra)
    env.key, env.allowed = key, allowed
    return env


def git_outside(env, *args):
    return subprocess.run(["git", "-C", str(env.root), "-c", "safe.directory=*",
                           "-c", f"gpg.ssh.allowedSignersFile={env.allowed}", *args],
                          capture_output=True, text=True)


def signs(env, step) -> list[dict]:
    s = json.loads(env.envgit("show", str(step), "--json", check=True).stdout)
    return [r for r in s["requests"] if r.get("method") == "sign"]
