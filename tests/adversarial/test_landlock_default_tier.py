"""The default tier's own isolation tests (tests/test_core_isolation.py), run again against the
Landlock backend: the project's daemon is started on a host that refuses user namespaces
(kit/nouserns.py), so every step it specs runs with Landlock + seccomp, whoever launches it;
each test then drives steps exactly as it does for bubblewrap (a terminal, Ctrl-C, SIGTERM).
Left out, with why: the ones whose claim is one a Landlock step does not make and says so on
its record (sandbox/backend.py WEAKER): its own pid namespace, loopback-only interfaces (its
TCP is refused, not unroutable), the host's System V IPC listing (/proc/sysvipc is the host's;
attaching is refused, which `test_the_hosts_ipc_cannot_be_attached` checks), the rest of the
machine listed as absent rather than unreadable. The file is the oracle's: a test that passes
here ran its steps under Landlock (checked at the end of each)."""

import json
import shutil
import subprocess

import pytest

from conftest import ENVGIT, Env, make_home
from kit import nouserns
from test_core_isolation import (  # noqa: F401  (collected here again, against this module's `proj`)
    PY,
    test_ctrl_c_reaches_the_command,
    test_exit_code_and_streams,
    test_host_abstract_unix_socket_unreachable,
    test_host_sockets_absent,
    test_nested_user_namespace_refused,
    test_no_capabilities,
    test_sigterm_is_forwarded,
    test_tiocsti_refused,
    test_token_passes_only_by_exact_name,
    test_tokens_never_reach_the_sandbox,
    test_tty_is_the_callers,
)

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group("landlock"),
              pytest.mark.skipif(not nouserns.available(), reason="making a host without user "
                                 "namespaces needs root and user namespaces (kit/nouserns.py)")]


@pytest.fixture
def proj(tmp_path):
    home = make_home(tmp_path)
    root = home / "proj"
    root.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    e = Env(home, root)
    for args in (["init"], ["daemon", "status"]):    # the daemon lives on the Landlock host
        r = subprocess.run(nouserns.wrap([ENVGIT, *args]), cwd=root, env=e.env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    yield e
    steps = json.loads(e.envgit("log", "--json", check=True).stdout)
    e.stop()
    assert steps and all((s.get("sandbox") or {}).get("backend") == "landlock" for s in steps), \
        [(s["id"], s.get("sandbox")) for s in steps]


@pytest.mark.skipif(shutil.which("ipcmk") is None, reason="ipcmk (util-linux) not installed")
def test_the_hosts_ipc_cannot_be_attached(proj):
    out = subprocess.run(["ipcmk", "-M", "4096"], capture_output=True, text=True, check=True).stdout
    shmid = out.split()[-1]
    try:
        code = (f"import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
                f"print('refused' if libc.shmat({shmid}, None, 0) == -1 else 'attached', ctypes.get_errno())")
        r = proj.envgit("run", "--", PY, "-c", code)
        assert "refused" in r.stdout and "attached" not in r.stdout, (r.stdout, r.stderr)
    finally:
        subprocess.run(["ipcrm", "-m", shmid], check=False)
