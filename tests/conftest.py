"""Shared fixtures: a real project with a real home around it, driven through the real CLI.

Each test gets a home directory of its own (with canary secrets in it) and a project inside
that home (`~/proj`), the layout an agent usually meets. Commands go through the installed
`envgit` console script, so the hot path, the daemon and bwrap are all the real ones.
"""

import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
ENVGIT = str(BIN / "envgit")
CANARY = "CANARY-7f3a9c-do-not-leak"


class Env:
    def __init__(self, home: Path, root: Path, extra_env=None):
        self.home, self.root = home, root
        self.env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8",
                    "ENVGIT_DAEMON_IDLE": "120", **(extra_env or {})}
        for k in ("ENVGIT_RESOLVE", "ENVGIT_UPSTREAM_CA"):
            if k in os.environ:
                self.env[k] = os.environ[k]

    def envgit(self, *args, cwd=None, env=None, input=None, timeout=120, check=False):
        r = subprocess.run([ENVGIT, *args], cwd=cwd or self.root, env={**self.env, **(env or {})},
                           input=input, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"envgit {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def run(self, script, cwd=None, env=None, **kw):
        """`envgit run -- sh -c SCRIPT`."""
        return self.envgit("run", "--", "sh", "-c", script, cwd=cwd, env=env, **kw)

    def pty_run(self, argv, send=None, when=b"", timeout=60):
        """`envgit run -- argv` on a real terminal; `send` is typed once `when` has been
        printed. Returns (wait status, everything the terminal showed). `timeout` bounds a
        hang only: a project's first step starts its daemon, seconds on a loaded machine."""
        pid, fd = pty.fork()
        if pid == 0:
            os.chdir(self.root)
            os.execve(ENVGIT, [ENVGIT, "run", "--", *argv], self.env)
        out, t0 = b"", time.monotonic()
        while time.monotonic() - t0 < timeout:
            if send and when in out:
                time.sleep(0.2)
                os.write(fd, send)
                send = None
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status, out.decode(errors="replace")
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        return status, out.decode(errors="replace")

    def write_policy(self, text):
        (self.root / "envgit.yaml").write_text(text)

    def stop(self):
        # `envgit daemon stop` waits up to 60 s for the daemon to exit (an auto-push under way
        # is let finish): the bound here is above it, or a loaded machine fails the teardown
        subprocess.run([ENVGIT, "daemon", "stop"], cwd=self.root, env=self.env,
                       capture_output=True, timeout=90)


def network_policy(allow, irreversible=({"preset": "default"},), l7=None):
    """A Policy with only network rules, for the pure request decisions and the gate."""
    from envgit.policy import Policy
    return Policy(path="envgit.yaml", sha256="0", deny_read=[], allow_read=[], allow_write=[],
                  protect=[], env_pass=[], env_set={}, network_allow=list(allow), l7=l7 or {},
                  ask_timeout=120, irreversible=[dict(e) for e in irreversible], shell=[],
                  max_file_size=0, snapshot_exclude=[])


def make_home(base: Path) -> Path:
    home = base / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text(CANARY + "\n")
    (home / ".ssh" / "known_hosts").write_text("github.com ssh-ed25519 AAAA\n")
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text(f"[default]\naws_secret_access_key={CANARY}\n")
    (home / ".config" / "gh").mkdir(parents=True)
    (home / ".config" / "gh" / "hosts.yml").write_text(f"oauth_token: {CANARY}\n")
    (home / ".bashrc").write_text("# the user's bashrc\n")
    (home / ".bash_history").write_text(f"export TOKEN={CANARY}\n")
    (home / ".netrc").write_text(f"machine github.com password {CANARY}\n")
    (home / ".pyenv").mkdir()
    (home / ".pyenv" / "version").write_text("system\n")
    return home


@pytest.fixture
def proj(tmp_path):
    home = make_home(tmp_path)
    root = home / "proj"
    root.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    e = Env(home, root)
    e.envgit("init", check=True)
    yield e
    e.stop()


@pytest.fixture
def bare_proj(tmp_path):
    """A project whose commands do not touch git: a plain directory."""
    home = make_home(tmp_path)
    root = home / "work"
    root.mkdir()
    e = Env(home, root)
    e.envgit("init", check=True)
    yield e
    e.stop()


# --- tiers, side-by-side groups, the unprivileged variant, the closing summary -----------

from kit import tiers as _tiers  # noqa: E402

_GUARD = _tiers.Guard()
# Tests that share one thing that cannot be used twice at once run on one xdist worker, one
# after another (`--dist loadgroup`): the VM tier boots one guest per module under TCG (a core
# each), and test_vm.py's tests follow one guest in order; the agents' tests share each
# agent's npm install and its state in the test homes' agent directories.
_GROUP_OF_TIER = {"vm": "vm", "agents": "agents"}


def pytest_configure(config):
    for tier, what in (("quick", "no process, no server: pure functions (dev/run test --quick)"),
                       ("sandbox", "starts the CLI, bwrap, git or a server"),
                       ("vm", "boots the VM tier's guest under QEMU"),
                       ("browser", "drives Debian's Chromium"),
                       ("agents", "runs an agent's npm binary"),
                       ("s3", "runs the S3-compatible server (rclone serve s3)")):
        config.addinivalue_line("markers", f"{tier}: {what} (set by tests/kit/tiers.py)")
    config.addinivalue_line("markers", "both_uids(why): run the `attacker` test as root and as an "
                            "unprivileged user; `why` says how the uid can change the outcome")
    config.addinivalue_line("markers", "xdist_group(name): tests sharing one machine-wide thing")
    config.addinivalue_line("markers", "machine_wide(why): changes what every step on the machine "
                            "sees (files in /etc, /opt): dev/run runs these alone, after the rest")
    _start_user_pool(config)
    _terminal_signals_at_default()
    missing = [t for t in ("bwrap", "git") if shutil.which(t) is None]
    if missing:
        raise pytest.UsageError(f"the tests need {', '.join(missing)}: run `dev/run test`, "
                                "which installs them")


def _terminal_signals_at_default():
    """The suite plays a person at a terminal, whose shell starts commands with SIGINT and
    SIGQUIT at their defaults. A runner that started it with them ignored (a script's `cmd &`
    ignores both, by POSIX, when job control is off) would pass the ignore on to every command
    the tests start, and envgit rightly keeps a signal its caller ignored ignored in the step
    (sandbox/launch.py): every Ctrl-C test would then fail. Put them back (in the controller
    and in each worker, which inherit the ignore)."""
    import signal
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _with_reason(node, name):
    """The node's `name` marker, which must say why (its first argument); None if absent."""
    mark = node.get_closest_marker(name)
    if mark is not None and not (mark.args and str(mark.args[0]).strip()):
        raise pytest.UsageError(f"{node.nodeid}: {name} needs its reason: @pytest.mark.{name}(\"why\")")
    return mark


def pytest_generate_tests(metafunc):
    """`attacker` runs as root, the more dangerous of the two; as an unprivileged user too only
    where the uid can change the outcome, which the test says with `both_uids(why)`."""
    if "attacker" in metafunc.fixturenames:
        both = _with_reason(metafunc.definition, "both_uids")
        metafunc.parametrize("attacker", ["root", "user"] if both else ["root"], indirect=True)


def _start_user_pool(config):
    """The controlling pytest (not an xdist worker) makes one unprivileged user per worker
    before any test runs and opens the path to the venv for them (tests/kit/users.py says why);
    pytest_unconfigure removes them."""
    from kit import users
    if hasattr(config, "workerinput") or users.POOL_ENV in os.environ or not users.can_make_users():
        return
    if (config.getoption("markexpr", "") or "").strip() == "quick":
        return
    n = config.getoption("numprocesses", None)
    try:
        n = max(1, int(n or 1))
    except (TypeError, ValueError):     # "auto", "logical": xdist's own count
        n = (os.cpu_count() or 1) * 4
    names = users.make_pool(n)
    os.environ[users.POOL_ENV] = ",".join(names)
    opened = users.open_path_to(os.path.realpath(sys.executable), ENVGIT)
    opened.__enter__()
    config._envgit_pool = (names, opened)


def pytest_unconfigure(config):
    pool = getattr(config, "_envgit_pool", None)
    if pool:
        from kit import users
        names, opened = pool
        opened.__exit__(None, None, None)
        users.drop_pool(names)
        os.environ.pop(users.POOL_ENV, None)


@pytest.hookimpl(tryfirst=True)         # before xdist's own, which reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        found = _tiers.tiers_of(item)
        for tier in found:
            item.add_marker(tier)
        _with_reason(item, "machine_wide")
        for tier, group in _GROUP_OF_TIER.items():
            if tier in found and not item.get_closest_marker("xdist_group"):
                item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """ENVGIT_TEST_TIMELINE=FILE: each test's worker, start and end (setup to teardown), one
    line each, for finding the run's critical path (which worker finished last, and on what)."""
    path = os.environ.get("ENVGIT_TEST_TIMELINE")
    t0 = time.time()
    try:
        return (yield)
    finally:
        if path:
            with open(path, "a") as f:
                f.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}\t{t0:.2f}\t"
                        f"{time.time():.2f}\t{item.nodeid}\n")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    _GUARD.active = item.nodeid if item.get_closest_marker("quick") else None
    try:
        return (yield)
    finally:
        _GUARD.active = None


def pytest_terminal_summary(terminalreporter):
    """Per tier: how many tests and the time they took (each test counted in every tier it
    needs; on N workers the times add up to about N times the wall time)."""
    counts, secs = {}, {}
    for reports in terminalreporter.stats.values():
        for r in reports:
            if getattr(r, "when", None) != "call":
                continue
            for tier in _tiers.TIERS:
                if tier in r.keywords:
                    counts[tier] = counts.get(tier, 0) + 1
                    secs[tier] = secs.get(tier, 0.0) + r.duration
    if counts:
        terminalreporter.write_sep("-", "tests per tier")
        for tier in _tiers.TIERS:
            if tier in counts:
                terminalreporter.write_line(f"{tier:8} {counts[tier]:5} tests  {secs[tier]:8.1f} s of test time")
