"""A git server over real SSH for one test: Debian's sshd on 127.0.0.1 (shared/notes/hosts.md),
a bare repository with one commit on `main` in the test's tmp, a client key known only to the
person's ssh-agent and ~/.ssh outside every step, and a project cloned from it whose policy
allows the server's host name (`gitserver`, the person's ~/.ssh/config alias for it).

    from kit.sshgit import ssh_world  # noqa: F401  (the fixture `ssh`)

The remote's refs are read with `git --git-dir` on the host: the oracle of what a push did.
"""

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import CANARY, Env, make_home
from kit.ports import free_port as _free_port

SSHD = "/usr/sbin/sshd"
HOST = "gitserver"
POLICY = """version: 1
network:
  allow: [gitserver]
irreversible:
  - preset: default
{extra}"""


def _git(*args, cwd=None, env=None):
    r = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} -> {r.returncode}: {r.stderr}")
    return r.stdout.strip()


class SSHWorld:
    def __init__(self, env: Env, bare: Path, agent_sock: Path, key: Path, port: int):
        self.env, self.bare, self.agent_sock, self.key, self.port = env, bare, agent_sock, key, port

    def refs(self) -> dict[str, str]:
        """The remote's refs, read on the host."""
        out = _git("--git-dir", str(self.bare), "for-each-ref", "--format=%(refname) %(objectname)")
        return dict(line.split(" ", 1) for line in out.splitlines()) if out else {}

    def policy(self, extra=""):
        self.env.write_policy(POLICY.format(extra=extra))

    def requests(self, step="last") -> list[dict]:
        import json
        shown = json.loads(self.env.envgit("show", step, "--json", check=True).stdout)
        return shown.get("requests") or []

    def commit(self, name="f.txt", text="x\n", message="work"):
        (self.env.root / name).write_text(text)
        _git("add", name, cwd=self.env.root)
        _git("commit", "-q", "-m", message, cwd=self.env.root)
        return _git("rev-parse", "HEAD", cwd=self.env.root)


@pytest.fixture(name="ssh")
def ssh_world(tmp_path):
    if not os.access(SSHD, os.X_OK):
        pytest.fail("sshd is not installed: dev/run installs openssh-server (apt-get install openssh-server)")
    if os.geteuid() != 0:
        pytest.fail("the test sshd needs root (its privilege separation directory /run/sshd)")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    home = make_home(tmp_path)
    srv = tmp_path / "sshd"
    srv.mkdir()
    keys = tmp_path / "keys"                     # the person's key, outside the home and project
    keys.mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(srv / "hostkey")], check=True)
    key = keys / "gitkey"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", CANARY, "-f", str(key)], check=True)
    shutil.copy(str(key) + ".pub", srv / "authorized_keys")
    port = _free_port()
    (srv / "sshd_config").write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {srv}/hostkey\n"
        f"AuthorizedKeysFile {srv}/authorized_keys\nUsePAM no\nStrictModes no\nPidFile {srv}/pid\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "AcceptEnv GIT_PROTOCOL\nLogLevel ERROR\n")
    sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(srv / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=open(srv / "log", "w"))
    agent = subprocess.run(["ssh-agent", "-s", "-a", str(keys / "agent.sock")], check=True,
                           capture_output=True, text=True).stdout
    agent_pid = int(agent.split("SSH_AGENT_PID=")[1].split(";")[0])
    agent_env = {"SSH_AUTH_SOCK": str(keys / "agent.sock")}
    subprocess.run(["ssh-add", "-q", str(key)], check=True, env={**os.environ, **agent_env},
                   capture_output=True)
    hostpub = (srv / "hostkey.pub").read_text().split()
    ssh_dir = home / ".ssh"
    (ssh_dir / "config").write_text(
        f"Host {HOST}\n  HostName 127.0.0.1\n  Port {port}\n  User {getpass.getuser()}\n"
        f"  IdentityFile {key}\n  IdentitiesOnly yes\n  StrictHostKeyChecking yes\n"
        f"  UserKnownHostsFile {ssh_dir}/known_hosts_gitserver\n")
    (ssh_dir / "known_hosts_gitserver").write_text(f"[127.0.0.1]:{port} {hostpub[0]} {hostpub[1]}\n")
    for _ in range(600):                          # sshd listening (seconds, on a loaded machine)
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    bare = tmp_path / "srv" / "app.git"
    seed = tmp_path / "seed"
    genv = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.test",
            "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@example.test"}
    _git("init", "-q", "--bare", "-b", "main", str(bare))
    _git("init", "-q", "-b", "main", str(seed))
    (seed / "README").write_text("hello\n")
    _git("add", "README", cwd=seed)
    _git("commit", "-q", "-m", "first", cwd=seed, env=genv)
    _git("push", "-q", str(bare), "main", cwd=seed)
    root = home / "proj"
    agent_env["ENVGIT_SSH_CONFIG"] = str(ssh_dir / "config")   # ssh reads the passwd home's, not $HOME's
    person = {**os.environ, "HOME": str(home), **agent_env, "GIT_SSH_COMMAND": f"ssh -F {ssh_dir}/config"}
    _git("clone", "-q", f"{HOST}:{bare}", str(root), env=person)    # the person's own clone, outside
    for k, v in (("user.email", "a@example.test"), ("user.name", "a")):
        _git("-C", str(root), "config", k, v)
    env = Env(home, root, agent_env)
    env.envgit("init", check=True)
    world = SSHWorld(env, bare, keys / "agent.sock", key, port)
    world.policy()
    try:
        yield world
    finally:
        env.stop()
        sshd.send_signal(signal.SIGTERM)
        sshd.wait(10)
        os.kill(agent_pid, signal.SIGTERM)
