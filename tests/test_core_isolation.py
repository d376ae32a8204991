"""Namespaces, environment, terminal and process behaviour of a step, tried for real."""

import os
import shutil
import signal
import socket
import subprocess

import pytest

from conftest import ENVGIT

# A Python visible inside the sandbox (the venv under the checkout is not part of its view).
PY = "/usr/bin/python3"


def test_tokens_never_reach_the_sandbox(proj):
    # values no path or name of the test's own can hold by chance (the test's directories
    # are in the output: "t5" was once in a temporary directory's random name)
    env = {"GITHUB_TOKEN": "ghp_secret1", "AWS_SECRET_ACCESS_KEY": "aws_secret2",
           "MY_API_KEY": "secret-api-key-3", "DB_PASSWORD": "secret-password-4",
           "LC_TOKEN": "secret-lc-token-5", "HARMLESS": "h"}
    r = proj.run("env", env=env)
    assert r.returncode == 0
    for v in ("ghp_secret1", "aws_secret2", "secret-api-key-3", "secret-password-4",
              "secret-lc-token-5", "HARMLESS"):
        assert v not in r.stdout
    assert "HOME=" in r.stdout and "PATH=" in r.stdout


def test_token_passes_only_by_exact_name(proj):
    proj.write_policy("version: 1\nenv:\n  pass: [GITHUB_TOKEN, 'MY_*']\n")
    r = proj.run("env", env={"GITHUB_TOKEN": "ghp_ok", "MY_TOKEN": "nope", "MY_NAME": "yes"})
    assert "GITHUB_TOKEN=ghp_ok" in r.stdout
    assert "MY_NAME=yes" in r.stdout
    assert "nope" not in r.stdout


def test_nested_user_namespace_refused(proj):
    r = proj.run("unshare -U true")
    assert r.returncode != 0


def test_no_network(proj):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    try:
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)"
        r = proj.envgit("run", "--", PY, "-c", code)
        assert r.returncode != 0 and "Connection refused" in r.stderr
        r = proj.run("cat /proc/net/dev")
        ifaces = {ln.split(":")[0].strip() for ln in r.stdout.splitlines()[2:]}
        assert ifaces == {"lo"}
    finally:
        srv.close()


def _unix_connect_inside(proj, address):
    """Listen on `address` on the host; try to connect to it from inside a step."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(address)
    srv.listen()
    try:
        code = f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({address!r}); print('connected')"
        return proj.envgit("run", "--", PY, "-c", code)
    finally:
        srv.close()


def test_host_abstract_unix_socket_unreachable(proj):
    r = _unix_connect_inside(proj, f"\0envgit-test-{os.getpid()}")
    assert r.returncode != 0 and "connected" not in r.stdout


def test_host_sockets_absent(proj):
    # A stand-in for the Docker socket: a listening unix socket in the host's /run.
    path = f"/run/envgit-test-docker-{os.getpid()}.sock"
    try:
        r = _unix_connect_inside(proj, path)
        assert r.returncode != 0 and "connected" not in r.stdout
        r = proj.run("ls /var/run/docker.sock /run/docker.sock")
        assert r.returncode != 0
    finally:
        os.unlink(path)


@pytest.mark.skipif(shutil.which("ipcmk") is None, reason="ipcmk (util-linux) not installed")
def test_host_sysv_ipc_invisible(proj):
    out = subprocess.run(["ipcmk", "-M", "4096"], capture_output=True, text=True, check=True).stdout
    shmid = out.split()[-1]
    try:
        r = proj.run("ipcs -m")
        assert shmid not in r.stdout
    finally:
        subprocess.run(["ipcrm", "-m", shmid], check=False)


def test_tiocsti_refused(proj):
    code = ("import fcntl, termios, sys\n"
            "try:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x'); print('INJECTED')\n"
            "except OSError as e:\n    print('refused', e.errno)\n")
    status, out = proj.pty_run([PY, "-c", code])
    assert "refused 1" in out and "INJECTED" not in out, out


def test_tty_is_the_callers(proj):
    status, out = proj.pty_run(["sh", "-c", "test -t 0 && test -t 1 && echo has-tty"])
    assert "has-tty" in out and os.waitstatus_to_exitcode(status) == 0


def test_ctrl_c_reaches_the_command(proj):
    status, out = proj.pty_run(["sh", "-c", "echo ready; sleep 30"], send=b"\x03", when=b"ready")
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT, (status, out)
    r = proj.envgit("show", "1", "--json", check=True)
    assert '"signal": "SIGINT"' in r.stdout


def test_exit_code_and_streams(proj):
    r = proj.envgit("run", "--", "sh", "-c", "read x; echo out:$x; echo err >&2; exit 42",
                    input="hello\n")
    assert r.returncode == 42
    assert r.stdout == "out:hello\n" and r.stderr == "err\n"


def test_sigterm_is_forwarded(proj):
    p = subprocess.Popen([ENVGIT, "run", "--", "sh", "-c", "trap 'echo got-term; exit 7' TERM; "
                          "echo ready; while :; do sleep 0.1; done"],
                         cwd=proj.root, env=proj.env, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=20)
    assert "got-term" in out and p.returncode == 7


def test_pid_namespace(proj):
    r = proj.run("ls /proc | grep -c '^[0-9]'")
    assert int(r.stdout) < 10


def test_the_rest_of_the_machine_is_absent(proj, tmp_path):
    other = tmp_path / "other-project"
    other.mkdir()
    (other / "notes.txt").write_text("private")
    r = proj.run(f"ls {other}; ls -A /root /home /mnt /media /srv 2>&1; ls /var; ls -A /run")
    assert "notes.txt" not in r.stdout
    for gone in ("/root", "/home", "/mnt"):
        assert f"cannot access '{gone}'" in r.stdout
    lines = [ln for ln in r.stdout.splitlines() if not ln.startswith("ls:")]
    assert set(lines) <= {"run", "tmp"}, lines          # /var holds only run and tmp; /run is empty


def test_no_capabilities(proj):
    r = proj.run("grep -E '^Cap(Prm|Eff|Bnd|Amb):' /proc/self/status")
    values = {ln.split(":")[0]: ln.split()[1] for ln in r.stdout.splitlines()}
    assert len(values) == 4 and all(int(v, 16) == 0 for v in values.values()), values
