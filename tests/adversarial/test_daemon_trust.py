"""The session daemon runs on the host, outside any sandbox, as the person (often root). Nothing a
step writes may make it run code: not Python it imports (the project on its import path), not
the `git` it starts (found on a PATH a project venv heads, or obeying a repository config a step
wrote or redirected), and no file a step names may be read by it into what the step sees (a
repository config's includes). The oracle is a marker file in the host's /tmp, which a step's
own /tmp (private to the sandbox) cannot reach: it appears only if the plant ran on the host;
or a canary in a file only the host can read.
"""

import glob
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import CANARY

ID = "-c user.name=a -c user.email=a@example.com"


@pytest.fixture
def marker():
    p = Path(f"/tmp/envgit-daemon-trust-{uuid.uuid4().hex}")
    yield p
    for q in glob.glob(f"{p}*"):
        os.unlink(q)


def committed(a, extra=""):
    """The setup of every repro: `git init`, `envgit init` (the fixture), one commit."""
    r = a.host(f"echo hello > README && {extra} git add -A && git {ID} commit -q -m one")
    assert r.returncode == 0, r.stderr


@pytest.fixture
def person_home(attacker):
    """$HOME as the person's processes see it (runuser gives the test user its passwd home)."""
    home = Path(attacker.host("echo $HOME").stdout.strip())
    made = not home.exists()
    if made:
        home.mkdir(parents=True)
        attacker.own(home)
    yield home
    if made:
        shutil.rmtree(home, ignore_errors=True)


def restart(a):
    a.envgit("daemon", "stop", check=True)


def plant_python(marker):
    """Python that writes the marker when imported, as a package named `envgit` and as modules
    named like the standard library the daemon imports."""
    body = f'import os\nopen("{marker}", "a").write(str(os.getuid()))\n'
    return ("import os\n"
            "os.makedirs('envgit/daemon', exist_ok=True)\n"
            f"for f in ('envgit/__init__.py', 'envgit/daemon/__init__.py', 'envgit/__main__.py',"
            f" 'asyncio.py', 'selectors.py', 'sqlite3.py', 'json.py', 'typing.py', 'marshal.py',"
            f" 'sitecustomize.py', 'usercustomize.py'):\n"
            f"    open(f, 'w').write({body!r})\n")


def test_daemon_imports_nothing_from_the_project(attacker, marker):
    """A step plants `envgit/__init__.py` (and stdlib-named modules) in the project; the next
    daemon, started from it, must not import them."""
    a = attacker
    committed(a)
    r = a.envgit("run", "--", "python3", "-c", plant_python(marker))
    assert r.returncode == 0, r.stderr
    assert (a.root / "envgit" / "__init__.py").exists()
    restart(a)
    r = a.envgit("run", "--", "sh", "-c", "echo still-works")
    a.envgit("policy", "check")
    restart(a)
    assert not marker.exists(), f"the daemon ran the planted Python as uid {marker.read_text()}"
    assert r.returncode == 0 and "still-works" in r.stdout, r.stderr


def test_daemon_refuses_a_project_on_its_import_path(attacker, tmp_path):
    """The second wall: a daemon whose sys.path holds a project directory (a PYTHONPATH naming
    it, envgit installed into the project's venv) says why and exits, serving nothing."""
    a = attacker
    (a.root / "lib").mkdir()
    a.own(a.root / "lib")
    a.envgit("daemon", "stop")
    env = {**a.env, "PYTHONPATH": str(a.root / "lib")}
    r = subprocess.run(a._argv([sys.executable, "-P", "-m", "envgit.daemon", str(a.root)]),
                       cwd="/", env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "inside the project" in r.stderr, (r.returncode, r.stderr)
    # and the client refuses before it starts one
    r = a.envgit("run", "--", "true", env={"PYTHONPATH": str(a.root / "lib")})
    assert r.returncode == 125 and "inside the project" in r.stderr, r.stderr
    assert a.envgit("run", "--", "true").returncode == 0        # without it: fine


FSMONITOR_CONFIG = "[core]\\n\\tfsmonitor = touch {m} #\\n"


def test_daemon_git_obeys_no_config_a_step_wrote(attacker, marker):
    """A step redirects `.git/commondir` to a repository whose config runs a program
    (core.fsmonitor, directly and through an include): the daemon's and `envgit policy check`'s
    reads of the repository (tracked files, hooks path, sanitised config) run nothing."""
    a = attacker
    committed(a, f"echo 'TOKEN={CANARY}' > .env && git add -f .env &&")
    inc = f"{marker}.inc"
    r = a.run("mkdir -p evil && git init -q --bare evil/c && "
              f"printf '{FSMONITOR_CONFIG.format(m=marker)}' >> evil/c/config && "
              f"printf '[core]\\n\\tfsmonitor = touch {inc} #\\n' > evil/inc && "
              "printf '[include]\\n\\tpath = ../inc\\n' >> evil/c/config && "
              "echo ../evil/c > .git/commondir")
    assert r.returncode == 0, r.stderr
    assert not marker.exists() and not os.path.exists(inc), "ran as soon as the step ended"
    r = a.envgit("run", "--", "true")
    out = a.envgit("policy", "check").stdout
    restart(a)
    r2 = a.envgit("run", "--", "true")          # a new daemon: the first step of a session
    restart(a)
    assert not marker.exists() and not os.path.exists(inc), "the daemon ran the repository's fsmonitor"
    # what those reads are for still works: the tracked .env is said, from the index itself
    assert "tracked by git" in out and ".env" in out, out
    assert "tracked by git" in r2.stderr, r2.stderr


def test_daemon_git_is_not_taken_from_path(attacker, marker):
    """With the project's .venv/bin first on PATH (an activated venv), a step plants
    `.venv/bin/git`: neither the daemon nor the envgit client runs it."""
    a = attacker
    committed(a)
    venv_bin = a.root / ".venv" / "bin"
    env = {"PATH": f"{venv_bin}:{a.env['PATH']}", "VIRTUAL_ENV": str(a.root / ".venv")}
    a.envgit("daemon", "stop")
    r = a.run("mkdir -p .venv/bin && echo 'home = /usr/bin' > .venv/pyvenv.cfg && "
              f"for t in git openssl find bwrap socat; do printf '#!/bin/sh\\ntouch {marker}.$(basename $0)\\n"
              "exec /usr/bin/$t \"$@\"\\n' > .venv/bin/$t; chmod +x .venv/bin/$t; done", env=env)
    assert r.returncode == 0, r.stderr
    assert (venv_bin / "git").exists()
    # the repository's config is read by the daemon's git (its sanitised copy is what a step sees)
    a.host("git config alias.hello status")
    r = a.envgit("run", "--", "sh", "-c", "cat .git/config", env=env)
    a.envgit("policy", "check", env=env)
    restart(a)
    r2 = a.envgit("run", "--", "true", env=env)
    restart(a)
    planted = glob.glob(f"{marker}*")
    assert not planted, f"ran the step's own {planted}"
    assert r.returncode == 0 and "hello" in r.stdout, (r.stdout, r.stderr)
    assert r2.returncode == 0, r2.stderr


@pytest.mark.both_uids("the files only the host may read are the person's own 0600 files in their HOME (runuser's "
                       "passwd home for a non-root person), which DAC does not keep from that person's daemon: only "
                       "its refusal to follow the include must")
def test_repository_config_includes_are_not_read_on_the_host(attacker, marker, person_home):
    """A step points a repository config (through .git/commondir) at files only the host can
    read, by `[include] path`: the sanitised copy the daemon makes must not hold them, and a
    step's `git config --list` shows no canary. An include the step itself can see still works,
    followed by git inside the step."""
    a = attacker
    committed(a, "printf '[alias]\\n\\tshared = log\\n' > shared.gitconfig && ")
    a.host("git config include.path ../shared.gitconfig")
    secret_tmp = Path(f"{marker}.ini")
    secret_tmp.write_text(f"[secret]\n\tvalue = {CANARY}-tmp\n")
    my_cnf = person_home / ".my.cnf"
    my_cnf.write_text(f"[client]\n\tuser = {CANARY}-home\n")
    a.own(secret_tmp, my_cnf)
    os.chmod(secret_tmp, 0o600)
    os.chmod(my_cnf, 0o600)
    r = a.run("git config --get alias.shared")               # legitimate: followed in the step
    assert r.returncode == 0 and r.stdout.strip() == "log", (r.stdout, r.stderr)
    r = a.run("git init -q --bare evil && "
              f"printf '[include]\\n\\tpath = {secret_tmp}\\n\\tpath = ~/.my.cnf\\n' >> evil/config && "
              "echo ../evil > .git/commondir")
    assert r.returncode == 0, r.stderr
    r = a.envgit("run", "--", "sh", "-c", "git config --list --show-origin; cat evil/config")
    restart(a)
    assert CANARY not in r.stdout and CANARY not in r.stderr, r.stdout
    copies = a.root / ".envgit" / "sandbox" / "git"
    for p in copies.glob("*"):
        assert CANARY not in p.read_text(errors="replace"), p
    assert "include.path" in r.stdout, r.stdout       # the keys reach the step's git, unresolved


@pytest.mark.both_uids("the person's global config is read from their HOME, runuser's passwd home for a non-root "
                       "person")
def test_the_persons_config_survives_a_repository_git_cannot_read(attacker, person_home):
    """A step redirects the repository to one whose config git cannot parse (git then refuses
    to read any config there, the person's too): the person's global config is still read,
    without its conditional includes, so a step cannot blank what the daemon learns from it."""
    a = attacker
    committed(a)
    (person_home / ".gitconfig").write_text("[alias]\n\tmine = log --oneline\n")
    a.own(person_home / ".gitconfig")
    r = a.run("mkdir -p evil/objects evil/refs && echo 'ref: refs/heads/main' > evil/HEAD && "
              "printf '[core\\nbroken' > evil/config && echo ../evil > .git/commondir")
    assert r.returncode == 0, r.stderr
    r = a.run("cd /tmp && git config --global --get alias.mine")
    assert r.returncode == 0 and r.stdout.strip() == "log --oneline", (r.stdout, r.stderr)


def test_an_interpreter_inside_the_project_does_not_start_the_daemon(attacker, marker):
    """envgit run by a project venv's python (`.venv/bin/python -m envgit`): the daemon would be
    started with that interpreter, which a step can replace. The client refuses instead."""
    a = attacker
    committed(a)
    a.envgit("daemon", "stop")
    venv = a.root / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(venv)], check=True, capture_output=True)
    a.own(venv)
    py = venv / "bin" / "python"
    # what a step would do to it: replaced by a script that leaves a mark, then runs python
    r = a.run(f"rm .venv/bin/python && printf '#!/bin/sh\\ntouch {marker}\\nexec {sys.executable} \"$@\"\\n'"
              " > .venv/bin/python && chmod +x .venv/bin/python")
    assert r.returncode == 0, r.stderr
    a.envgit("daemon", "stop", check=True)
    r = subprocess.run(a._argv([sys.executable, "-c", "import os, sys; sys.executable = sys.argv[1]; "
                                "from envgit.cli import main; sys.argv = ['envgit', 'run', '--', 'true']; main()",
                                str(py)]),
                       cwd=a.root, env=a.env, capture_output=True, text=True, timeout=60)
    assert not marker.exists(), "the daemon was started with the step's interpreter"
    assert r.returncode != 0 and "inside the project" in r.stderr, r.stderr


def test_an_agent_binary_symlinked_from_the_project_is_not_launched(attacker, marker):
    """A step's `.venv/bin/codex` that is a symlink to a trusted interpreter (python3) outside
    the project: its target is outside, but which program runs, with envgit's arguments (files
    in the project's working directory, to python), is the step's choice. Refused by its name."""
    a = attacker
    body = f"open('{marker}', 'a').write('ran')\n"
    r = a.run("mkdir -p .venv/bin && ln -sf /usr/bin/python3 .venv/bin/codex && "
              f"for f in exec app-server; do printf \"{body}\" > $f; done")
    assert r.returncode == 0, r.stderr
    venv_path = f"{a.root}/.venv/bin:{a.env['PATH']}"
    out = a.envgit("codex", "exec", "hi", env={"PATH": venv_path}, timeout=60)
    assert not marker.exists(), "python ran the step's file as codex"
    assert out.returncode != 0 and "inside the project" in out.stderr, out.stderr
