"""The CLI people expect (issue 12 section 5): --version and --help everywhere with an example,
a closed pipe ends quietly, `log` shows whole commands readably with a session column and
strict filters, step references, one --json convention whose keys docs/JSON.md documents,
progress on a terminal only, and an install with a real pipx."""

import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from conftest import ENVGIT, Env, make_home
from kit.git_remote import git_remote  # noqa: F401  (the fixture `remote`)
from modelserver import clone_for_push

ROOT = Path(__file__).resolve().parent.parent
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def commands_and_subcommands():
    """Every command line `envgit --help` offers, nested ones (policy show) included."""
    import argparse

    from envgit import cli
    out = []

    def walk(parser, prefix):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                listed = {a.dest for a in action._choices_actions}
                for name, sub in action.choices.items():
                    assert name in listed, f"`envgit {' '.join(prefix + [name])}` is hidden from --help"
                    out.append(prefix + [name])
                    walk(sub, prefix + [name])
    walk(cli._parser(False), [])
    return out


def test_version_is_the_package_version():
    from importlib.metadata import version
    r = subprocess.run([ENVGIT, "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == f"envgit {version('envgit')}"


def test_every_command_has_help_with_an_example(tmp_path):
    cmds = commands_and_subcommands()
    top = subprocess.run([ENVGIT, "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert top.returncode == 0
    for c in (c for c in cmds if len(c) == 1):
        assert re.search(rf"^\s+{c[0]}\s", top.stdout, re.M), f"{c[0]} not listed in envgit --help"
    assert "exit status" in top.stdout
    for c in cmds:
        for flag in ("--help", "-h"):
            r = subprocess.run([ENVGIT, *c, flag], capture_output=True, text=True, cwd=tmp_path, timeout=30)
            assert r.returncode == 0, (c, r.stderr)
            assert r.stdout.startswith(f"usage: envgit {' '.join(c)}"), (c, r.stdout[:200])
            example = re.split(r"\nexamples?:\n", r.stdout, maxsplit=1)[1:]
            example = example[0] if example else ""
            assert f"envgit {' '.join(c)}" in example, f"envgit {' '.join(c)} --help has no example"
    # the hot-path commands are among them, and their --help is envgit's, not the tool's
    assert {"run", "claude", "codex", "copilot", "mcp"} <= {c[0] for c in cmds}


def test_run_help_is_envgits_and_run_dashdash_help_runs_the_command(proj):
    r = proj.envgit("run", "--help", check=True)
    assert r.stdout.startswith("usage: envgit run")
    r = proj.envgit("run", "--", "python3", "--help")          # the command's own --help
    assert r.returncode == 0 and r.stdout.startswith("usage: python3"), r.stdout[:200] + r.stderr
    steps = json.loads(proj.envgit("log", "--json", check=True).stdout)
    assert [s["argv"] for s in steps] == [["python3", "--help"]]     # --help made no step
    # an agent's --help is envgit's too (no binary needed to print it); `--` passes it on
    r = proj.envgit("claude", "--help", check=True)
    assert r.stdout.startswith("usage: envgit claude") and "envgit claude -- --help" in r.stdout


def _many_long_steps(proj, n=3):
    big = "x" * 100_000
    for i in range(n):
        assert proj.envgit("run", "--", "true", f"{i}-{big}", big, check=True).returncode == 0


@pytest.mark.parametrize("argv", [["log"], ["log", "--json"], ["show", "last"], ["show", "last", "--json"]])
def test_output_into_a_closed_pipe_ends_quietly(proj, argv):
    if argv == ["log"]:
        _many_long_steps(proj)
    else:
        _many_long_steps(proj, 1)
    cmd = " ".join([ENVGIT, *argv])
    r = subprocess.run(["bash", "-c", f"{cmd} | head -c 10 >/dev/null; echo \"${{PIPESTATUS[0]}}\""],
                       cwd=proj.root, env=proj.env, capture_output=True, text=True, timeout=60)
    assert r.stderr == "", r.stderr                # no BrokenPipeError traceback, no message
    assert r.stdout.strip() == str(128 + signal.SIGPIPE)    # as git: killed by SIGPIPE


def _bash_words(line: str) -> list[str]:
    """The words bash reads from `line` (what a person pasting it would run)."""
    r = subprocess.run(["bash", "-c", f"printf '%s\\0' {line}"], capture_output=True, timeout=10)
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().split("\0")[:-1]


def test_log_quotes_commands_readably_and_exactly(proj):
    argv = ["printf", "%s\n", "it's", "say \"hi\" $HOME", "two\nlines", "tab\there", "a b", "\x1b[31mred"]
    assert proj.envgit("run", "--", *argv).returncode == 0
    line = proj.envgit("log", check=True).stdout.splitlines()[-1]
    cmd = line[line.index("printf"):]
    assert "\x1b" not in cmd and "\n" not in cmd                     # inert
    assert "\"it's\"" in cmd and "$'two\\nlines'" in cmd              # read as a person types it
    assert _bash_words(cmd) == argv                                   # and exactly the command


def test_log_shows_the_whole_command_wrapped_on_a_terminal(proj):
    words = [f"word{i:03d}" for i in range(120)]
    assert proj.envgit("run", "--", "echo", *words).returncode == 0
    piped = proj.envgit("log", check=True).stdout
    assert len(piped.splitlines()) == 1 and " ".join(words) in piped       # piped: one whole line
    shown = _pty(proj, ["log"], cols=80)
    lines = [ln for ln in shown.splitlines() if ln.strip()]
    assert 1 < len(lines) <= 4 and all(len(ln) <= 80 for ln in lines), shown
    assert "word000" in shown and "…" in shown and "word119" not in shown
    whole = _pty(proj, ["log", "--no-trunc"], cols=80)
    assert "word119" in whole and all(w in whole for w in words)
    assert all(len(ln) <= 80 for ln in whole.splitlines())


def test_log_session_column_and_filters(proj):
    sid = "claude-20261203-101010-ab12"
    assert proj.run("true", env={"ENVGIT_SESSION": sid}).returncode == 0
    assert proj.run("true").returncode == 0
    log = proj.envgit("log", check=True).stdout.splitlines()
    assert "claude:ab12" in log[0] and "run:" in log[1]
    for name in (sid, "claude:ab12", "ab12"):
        steps = json.loads(proj.envgit("log", "--session", name, "--json", check=True).stdout)
        assert [s["id"] for s in steps] == [1] and steps[0]["agent"] == "claude"
    r = proj.envgit("log", "--session", "nosuch")
    assert r.returncode == 2 and "no such session nosuch" in r.stderr and r.stdout == ""
    r = proj.envgit("log", "--session", "nosuch", "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["error"].startswith("no such session") and r.stderr == ""
    assert len(json.loads(proj.envgit("log", "--since", "1h", "--json", check=True).stdout)) == 2
    assert json.loads(proj.envgit("log", "--since", "2999-01-01", "--json", check=True).stdout) == []
    assert proj.envgit("log", "--since", "2999-01-01", check=True).stdout.strip() == "no steps match"
    r = proj.envgit("log", "--since", "yesterday")
    assert r.returncode == 2 and "duration" in r.stderr
    r = proj.envgit("log", "-n", "0")
    assert r.returncode == 2


def test_step_references_in_show(proj):
    for i in range(3):
        assert proj.run(f"echo {i}").returncode == 0
    def shown(ref):
        return json.loads(proj.envgit("show", ref, "--json", check=True).stdout)["id"]
    assert (shown("last"), shown("last~1"), shown("last~2"), shown("2")) == (3, 2, 1, 2)
    r = proj.envgit("show", "last~3")
    assert r.returncode == 2 and "no step last~3" in r.stderr
    r = proj.envgit("show", "last~3", "--json")
    assert r.returncode == 2 and r.stderr == "" and json.loads(r.stdout) == {
        "error": "no step last~3: the journal has 3 step(s); `envgit log` lists them", "exit": 2}
    r = proj.envgit("show", "first", "--json")                 # argparse's own error, as JSON too
    assert r.returncode == 2 and r.stderr == "" and "last~K" in json.loads(r.stdout)["error"]


def test_errors_are_json_under_json_outside_a_project(tmp_path):
    for argv in (["log", "--json"], ["show", "1", "--json"], ["fsck", "--json"]):
        r = subprocess.run([ENVGIT, *argv], cwd=tmp_path, capture_output=True, text=True,
                           env={**os.environ, "HOME": str(tmp_path)})
        doc = json.loads(r.stdout)
        assert r.returncode == 2 and set(doc) == {"error", "exit"} and doc["exit"] == 2, r.stdout
        assert "envgit init" in doc["error"] and r.stderr == ""


def test_every_command_says_its_errors_as_json_under_json(proj):
    """The convention holds for every command that takes --json (commands/__init__.py), not
    only the ones that render through dispatch: stdout one {error, exit} document, stderr empty."""
    assert proj.run("echo 1 > a").returncode == 0
    for argv in (["show", "999"], ["diff", "999"], ["rewind", "999", "--yes"], ["ls", "999"],
                 ["log", "--session", "nosuch"], ["approve", "999"], ["deny", "999"],
                 ["gc", "--keep-within", "soon"]):
        r = proj.envgit(*argv, "--json")
        assert r.stderr == "", (argv, r.stderr)
        doc = json.loads(r.stdout)
        assert set(doc) == {"error", "exit"} and r.returncode == doc["exit"] != 0, (argv, doc, r.returncode)


# --- docs/JSON.md ------------------------------------------------------------------------

def documented_keys() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "JSON.md").read_text()
    out = {}
    for name, table in re.findall(r"<!-- keys: (\S+) -->\n((?:\|.*\n)+)", text):
        rows = table.splitlines()[2:]
        out[name] = {re.match(r"\|\s*`([^`]+)`", r).group(1) for r in rows}
    return out


def _all_times(obj, path=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "at" or k.endswith("_at"):
                yield f"{path}.{k}", v
            yield from _all_times(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _all_times(v, f"{path}[{i}]")


@pytest.fixture
def netproj(tmp_path, remote):
    """A clone of a local HTTPS git remote whose pushes the policy asks about."""
    home = make_home(tmp_path)
    root = home / "app"
    env = Env(home, root, {"ENVGIT_RESOLVE": remote.resolve, "ENVGIT_UPSTREAM_CA": str(remote.ca.cert_path)})
    hostport = remote.url.split("/")[2]
    clone_for_push(env, remote)          # a clone of the remote, envgit init; its policy below
    env.write_policy(f"version: 1\nnetwork:\n  allow: [\"{hostport}\"]\nirreversible:\n  - preset: default\n"
                     "  - rule: git-push\n    action: ask\n")
    yield env
    env.stop()


@pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")
def test_json_keys_are_the_documented_ones(netproj):
    doc = documented_keys()
    p = netproj
    emitted = {}

    def j(*argv, code=0):
        r = p.envgit(*argv, "--json")
        assert r.returncode == code, (argv, r.stdout, r.stderr)
        d = json.loads(r.stdout)
        for where, t in _all_times(d):
            assert t is None or ISO.match(t), f"envgit {' '.join(argv)}: {where} = {t!r} is not ISO-8601 UTC"
        return d

    r = p.run("echo 'console.log(1)' > greet.js && git add greet.js && git commit -qm greet")
    assert r.returncode == 0, r.stderr
    # a push the policy asks about waits in `pending` while another terminal looks, then is denied
    asked = []

    def answer():
        end = time.monotonic() + 60
        while time.monotonic() < end and not asked:
            asks = j("pending")
            if asks:
                asked.append(asks)
                emitted["answer"] = json.loads(p.envgit("deny", str(asks[0]["id"]), "--json", check=True).stdout)
            time.sleep(0.1)
    t = threading.Thread(target=answer)
    t.start()
    push = p.run("git push -q origin main")
    t.join()
    assert asked and push.returncode != 0, push.stderr
    emitted["pending"] = asked[0][0]
    emitted["pending.question"] = asked[0][0]["question"]
    assert emitted["pending.question"]["refs"], "the push's refs are what the person is asked about"

    assert p.run("echo after > note.txt").returncode == 0
    steps = j("log")
    shown = j("show", "last")
    assert shown == steps[-1]
    emitted["step"] = shown
    emitted["step.snapshot"] = next(s["snapshot"] for s in steps if s["snapshot"] and s["snapshot"]["tree"])
    raw = _raw_snapshot_keys(p)
    assert raw <= doc["step.snapshot"], \
        f"the daemon records snapshot keys docs/JSON.md lacks: {raw - doc['step.snapshot']}"
    d = j("diff", "1", "last")
    emitted["diff"] = d
    assert d["changes"], d
    emitted["diff.changes"] = d["changes"][0]
    emitted["diff.parts"] = d["parts"][0]
    emitted["doctor"] = j("doctor")[0]
    emitted["ps"] = j("ps")
    emitted["policy.check"] = j("policy", "check")
    good = (p.root / "envgit.yaml").read_text()
    p.write_policy("version: 1\nfilesystem:\n  deny_reed: []\n")
    bad = j("policy", "check", code=2)
    assert "envgit.yaml:3:3" in bad["error"] and set(bad) == doc["error"]
    p.write_policy(good)
    emitted["fsck"] = j("fsck")
    emitted["error"] = j("show", "999", code=2)
    plan = j("rewind", "1", "--dry-run")
    emitted["rewind"] = plan
    done = j("rewind", "1", "--yes")
    emitted["rewind.applied"] = {k: v for k, v in done.items() if k not in plan}
    assert set(plan) <= set(done)
    emitted["gc"] = j("gc", "--keep-last", "1")

    for name, obj in emitted.items():
        assert name in doc, f"docs/JSON.md has no key table `{name}`"
        assert set(obj) == doc[name], (f"docs/JSON.md `{name}`: emitted but not documented "
                                       f"{set(obj) - doc[name]}, documented but not emitted {doc[name] - set(obj)}")
    for s in steps:                                   # every step has every key
        assert set(s) == doc["step"]


def test_init_and_protected_json_keys(tmp_path):
    doc = documented_keys()
    def j(*argv):
        r = subprocess.run([ENVGIT, *argv, "--json"], cwd=tmp_path, capture_output=True, text=True,
                           env={**os.environ, "HOME": str(tmp_path.parent)})
        assert r.returncode == 0 and r.stderr == "", r.stderr
        return json.loads(r.stdout)
    first, again = j("init"), j("init")
    assert set(first) == set(again) == doc["init"]
    assert first["wrote_policy"] and first["added_to_gitignore"]
    assert not again["wrote_policy"] and not again["added_to_gitignore"]
    routes = j("policy", "protected")
    assert routes and all(set(r) == doc["protected"] for r in routes)
    assert {"path": "**/.git/hooks", "action": "protect"}.items() <= routes[0].items()


def _raw_snapshot_keys(p) -> set:
    """Every key a snapshot summary has in the journal itself (what show normalises)."""
    import sqlite3
    db = sqlite3.connect(f"file:{p.root / '.envgit' / 'journal.sqlite'}?mode=ro", uri=True)
    keys = set()
    for (body,) in db.execute("SELECT body FROM entries WHERE kind = 'end'"):
        try:
            snap = json.loads(body).get("snapshot")
        except ValueError:
            continue
        if isinstance(snap, dict):
            keys |= set(snap)
    db.close()
    return keys


# --- progress -----------------------------------------------------------------------------

def _pty(env, argv, cols=100, timeout=60) -> str:
    """`envgit ARGV` on a real terminal `cols` wide: what the terminal showed."""
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(env.root)
        os.execve(ENVGIT, [ENVGIT, *argv], {**env.env, "TERM": "xterm"})
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
    out, t0 = b"", time.monotonic()
    while time.monotonic() - t0 < timeout:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    else:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return out.decode(errors="replace").replace("\r\n", "\n")


def test_progress_on_a_terminal_and_quiet_when_piped(proj):
    for i in range(3):                              # a few packs for fsck to re-hash, gc to repack
        assert proj.run(f"head -c 200000 /dev/urandom > f{i}.bin").returncode == 0
    shown = _pty(proj, ["fsck"])
    assert "fsck: re-hashing packs" in shown and "pack" in shown and "fsck: ok" in shown, shown
    piped = proj.envgit("fsck", check=True)
    assert piped.stderr == "" and "re-hashing" not in piped.stdout
    shown = _pty(proj, ["gc", "--keep-last", "1"])
    assert "gc: repacking" in shown and "gc: dropped" in shown, shown
    assert proj.run("head -c 100 /dev/urandom > g.bin").returncode == 0
    piped = proj.envgit("gc", "--keep-last", "1", check=True)
    assert piped.stderr == "", piped.stderr


def test_first_snapshot_of_a_big_project_shows_progress_on_a_terminal(tmp_path):
    home = make_home(tmp_path)
    for n, piped in ((0, False), (1, True)):
        root = home / f"big{n}"
        for d in range(20):                         # 2,000 files
            (root / f"d{d}").mkdir(parents=True)
            for f in range(100):
                (root / f"d{d}" / f"f{f}.txt").write_bytes(os.urandom(1000))
        # shown once the snapshot has run this long: 0, so the line is drawn however fast this
        # machine reads 2,000 files (a real delay made the test pass only on a slow machine)
        env = Env(home, root, {"ENVGIT_PROGRESS_AFTER": "0"})
        env.envgit("init", check=True)
        try:
            if piped:
                r = env.envgit("run", "--", "echo", "done")
                assert r.returncode == 0 and r.stdout == "done\n" and r.stderr == "", r.stderr
            else:
                pid, fd = pty.fork()
                if pid == 0:
                    os.chdir(root)
                    os.execve(ENVGIT, [ENVGIT, "run", "--", "echo", "done"], env.env)
                shown, t0 = b"", time.monotonic()
                while time.monotonic() - t0 < 120:
                    if select.select([fd], [], [], 0.1)[0]:
                        try:
                            chunk = os.read(fd, 4096)
                        except OSError:
                            break
                        if not chunk:
                            break
                        shown += chunk
                _, status = os.waitpid(pid, 0)
                assert os.waitstatus_to_exitcode(status) == 0
                text = shown.decode(errors="replace")
                assert re.search(r"envgit: first snapshot: \d+ files read", text), text
                assert text.endswith("\r\x1b[Kdone\r\n"), repr(text[-80:])   # cleared, then the command
        finally:
            env.stop()


# --- installing as a Python user does ----------------------------------------------------

def _checkout_copy(dest: Path):
    """The checkout as a clone would have it: every file git knows or would add."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for f in filter(None, files):
        src = ROOT / os.fsdecode(f)
        if src.is_file():
            (dest / os.fsdecode(f)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / os.fsdecode(f))


PIPX = "pipx>=1.7,<2"


def test_pipx_install_from_a_checkout_and_from_a_wheel(tmp_path):
    """A real pipx (from the package index) installs envgit into a PIPX_HOME of its own, from
    a checkout and from a wheel built from it; the installed `envgit` answers --version and
    doctor, and runs a step. The index is reached (dependencies come from it), as CI can."""
    tool = tmp_path / "tool"
    subprocess.run([sys.executable, "-m", "venv", str(tool)], check=True)
    # --no-compile: pip byte-compiles every installed module (botocore's thousands among them)
    # at install; an interpreter compiles what it imports on its own, and the test's time was
    # mostly that, three installs over
    r = subprocess.run([tool / "bin" / "pip", "install", "-q", "--no-compile", "-c", str(ROOT / "constraints.txt"),
                        PIPX], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    src = tmp_path / "checkout"
    _checkout_copy(src)
    r = subprocess.run([tool / "bin" / "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    [wheel] = (tmp_path / "dist").glob("envgit-*.whl")
    for name, what in (("checkout", str(src)), ("wheel", str(wheel))):
        home = tmp_path / f"pipx-{name}"
        env = {**os.environ, "PIPX_HOME": str(home / "home"), "PIPX_BIN_DIR": str(home / "bin"),
               "PIPX_MAN_DIR": str(home / "man"), "PIPX_DEFAULT_PYTHON": sys.executable}
        env.pop("VIRTUAL_ENV", None)
        r = subprocess.run([tool / "bin" / "pipx", "install", "--pip-args",
                            f"--no-compile --constraint {src / 'constraints.txt'}", what],
                           env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
        envgit = home / "bin" / "envgit"
        from envgit import __version__
        r = subprocess.run([envgit, "--version"], capture_output=True, text=True, timeout=60)
        assert r.stdout.strip() == f"envgit {__version__}", r.stdout + r.stderr
        r = subprocess.run([envgit, "doctor", "--json"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        checks = json.loads(r.stdout)
        assert r.returncode == 0 and all(c["ok"] for c in checks if c["required"]), checks
        assert not any("dev/run" in c["fix"] for c in checks), "a pip user is told to run dev/run"
        assert "installed as a package" in next(c["detail"] for c in checks if c["name"] == "envgit")
        # the installed envgit runs a real step, from its own venv
        project = tmp_path / f"project-{name}"
        project.mkdir()
        penv = {"PATH": os.environ["PATH"], "HOME": str(make_home(tmp_path / f"h-{name}")), "LANG": "C.UTF-8"}
        subprocess.run([envgit, "init"], cwd=project, env=penv, check=True, capture_output=True)
        r = subprocess.run([envgit, "run", "--", "sh", "-c", "echo from-pipx > out.txt"], cwd=project, env=penv,
                           capture_output=True, text=True, timeout=120)
        subprocess.run([envgit, "daemon", "stop"], cwd=project, env=penv, capture_output=True, timeout=60)
        assert r.returncode == 0 and (project / "out.txt").read_text() == "from-pipx\n", r.stderr
        py = home / "home" / "venvs" / "envgit" / "bin" / "python"
        meta = json.loads(subprocess.run([py, "-c", "import json, importlib.metadata as m; "
                                          "print(json.dumps(m.metadata('envgit').json))"],
                                         capture_output=True, text=True, check=True).stdout)
        assert meta["description_content_type"] == "text/markdown" and "envgit" in meta["description"]
        wants = [d.split(";")[0] for d in meta["requires_dist"]]        # less the extra's marker
        assert all(re.search(r"[<>]", d) and "==" not in d for d in wants), wants   # ranges, not pins


def test_log_mark_filter(proj):
    (proj.root / ".env").write_text("SECRET=1\n")
    assert proj.run("true").returncode == 0
    proj.run("cat .env")                                   # a denied path: marked
    assert proj.run("true").returncode == 0
    proj.run("cat .env")
    marked = json.loads(proj.envgit("log", "--json", check=True).stdout)
    with_mark = [s["id"] for s in marked if s["marks"]]
    assert with_mark and with_mark == [2, 4], marked
    mark = marked[1]["marks"][0]
    got = json.loads(proj.envgit("log", "--mark", f"nosuch,{mark}", "--json", check=True).stdout)
    assert [s["id"] for s in got] == [2, 4]
    got = json.loads(proj.envgit("log", "--mark", mark, "-n", "1", "--json", check=True).stdout)
    assert [s["id"] for s in got] == [4]                   # the last N that carry it
    assert proj.envgit("log", "--mark", "nosuch", check=True).stdout.strip() == "no steps match"
