"""Red team: host commands a policy names run on the host, outside every sandbox, chosen by a
file that comes with a cloned repository (hostcmd/, policy/hostentries.py).

- a project credential's `from: command` ran at the first request that needed it, unasked:
  now only once the person approved its exact text (`envgit trust`), and again when it changes;
- `printenv ORG_TOKEN` (or `cat` of the organisation's token file) as a project credential
  handed the organisation's credential to a host the organisation never allowed it for;
- an MCP upstream `npx NAME` or `python -m NAME` started in the project directory, so a
  `node_modules/.bin/NAME` or a `NAME.py` a step planted there ran on the host instead.

Real steps (`envgit run` through the real gate) and the real `envgit mcp`; the oracle is a
marker file (in the home, which no step can write) or the canary at the server."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import CANARY
from gatekit import hostport, netproject, servers

pytestmark = pytest.mark.skipif(shutil.which("socat") is None or shutil.which("curl") is None,
                                reason="socat or curl is not installed")

TOKEN = "tok_PROJECTvaluePROJECTvalue1234"
NOT_ROOT_OR_ETC = pytest.mark.skipif(os.path.lexists("/etc/envgit/policy.yaml") or os.geteuid() != 0,
                                     reason="needs root (the org file must be root's) and no real "
                                            "/etc/envgit/policy.yaml")


def _credential(stub, command):
    return ("credentials:\n  mine:\n"
            f"    from: {{ command: {command!r} }}\n"
            f"    hosts: [\"{hostport(stub, 'api.github.com')}\"]\n")


def _send(attacker, stub):
    return attacker.run(f"curl -s -H \"Authorization: Bearer $ENVGIT_CREDENTIAL_MINE\" "
                        f"https://{hostport(stub, 'api.github.com')}/x")


def _got(stub, value):
    return [q for q in stub.requests if value in repr(q)]


@pytest.mark.both_uids("the approvals are the person's own state, under each uid's home")
def test_a_project_credential_command_runs_only_once_trusted(attacker):
    marker = attacker.home / "credential-command-ran"
    cmd = f"touch {marker}; printf %s {TOKEN}"
    # runuser sets HOME to the test user's passwd home, which does not exist: its state goes
    # in the test home instead, as a person with such a home would say
    attacker.env["XDG_STATE_HOME"] = str(attacker.home / ".local" / "state")
    with servers() as (git, stub):
        netproject(attacker, git, stub, _credential(stub, cmd), trust=False)
        r = _send(attacker, stub)
        assert not marker.exists(), "the project's credential command ran without being trusted"
        assert not _got(stub, TOKEN)
        assert "envgit trust" in r.stdout and "envgit.yaml:" in r.stdout, r.stdout + r.stderr

        shown = attacker.envgit("trust")                # no terminal: shows, approves nothing
        assert shown.returncode == 1 and cmd in shown.stdout, shown.stdout + shown.stderr
        assert "envgit trust --yes" in shown.stderr
        attacker.envgit("trust", "--yes", check=True)
        _send(attacker, stub)
        assert marker.exists() and _got(stub, f"Bearer {TOKEN}")    # trusted: it runs

        marker.unlink()
        stub.requests.clear()
        netproject(attacker, git, stub, _credential(stub, cmd + "; true"), trust=False)  # changed
        r = _send(attacker, stub)
        assert not marker.exists(), "a changed credential command ran on the old approval"
        assert not _got(stub, TOKEN)
        assert "envgit trust" in r.stdout and "not trusted" in r.stdout, r.stdout

        attacker.envgit("trust", "--revoke", check=True)
        assert "nothing approved" in attacker.envgit("trust", "--list", check=True).stdout


def _org(text) -> str:
    d = tempfile.mkdtemp(prefix="envgit-org-")
    os.chmod(d, 0o755)
    p = Path(d) / "policy.yaml"
    p.write_text(text)
    p.chmod(0o644)
    return str(p)


@NOT_ROOT_OR_ETC
@pytest.mark.parametrize("org_source, command", [
    ("{ env: ORG_TOKEN }", "printenv ORG_TOKEN"),                 # the variable: not in its env
    ("{ env: ORG_TOKEN }", "echo $ORG_TOKEN; printenv CORP_SECRET_X"),
    ("{ file: ~/org-token }", "cat $HOME/org-token"),             # the value: refused as output
])
def test_a_project_command_cannot_hand_over_the_orgs_credential(attacker, org_source, command):
    (attacker.home / "org-token").write_text(CANARY + "\n")
    with servers() as (git, stub):
        org = _org("version: 1\nenv:\n  deny: [\"CORP_SECRET_*\"]\ncredentials:\n  orgtok:\n"
                   f"    from: {org_source}\n    hosts: [\"{hostport(git)}\"]\n")
        attacker.env.update(ENVGIT_ORG_POLICY=org, ORG_TOKEN=CANARY, CORP_SECRET_X=CANARY)
        netproject(attacker, git, stub, _credential(stub, command))
        attacker.envgit("trust", "--yes", check=True)     # the person approved it, even so
        r = _send(attacker, stub)
        assert not _got(stub, CANARY), "the organisation's credential reached a host it is not for"
        assert CANARY not in r.stdout + r.stderr
        shutil.rmtree(os.path.dirname(org), ignore_errors=True)


@NOT_ROOT_OR_ETC
def test_the_org_can_forbid_project_host_commands(attacker):
    org = _org("version: 1\nproject_host_commands: deny\n")
    attacker.env["ENVGIT_ORG_POLICY"] = org
    attacker.stop()
    attacker.write_policy("version: 1\ncredentials:\n  mine:\n    from: { command: \"touch "
                          f"{attacker.home}/ran\" }}\n    hosts: [example.com]\n")
    r = attacker.run("true")
    assert r.returncode == 125 and "project_host_commands" in r.stderr and org in r.stderr, r.stderr
    assert "envgit.yaml:4:" in r.stderr and "forbids" in r.stderr
    shutil.rmtree(os.path.dirname(org), ignore_errors=True)


# --- MCP upstreams ---------------------------------------------------------------------------

def _python_outside(base: Path) -> str:
    """A Python outside the project that finds the MCP SDK and tests/mcp_fixture_server.py as
    installed modules (a .pth file in its own site-packages), as `pipx install` would."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "py")], check=True)
    py = base / "py" / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "envgit-tests.pth").write_text(f"{ours}\n{Path(__file__).resolve().parent.parent}\n")
    return str(py)


def _mcp_project(attacker, servers_yaml):
    from mcp_fixture_server import make_corpus
    corpus = attacker.home.parent / "corpus"
    if not corpus.exists():
        make_corpus(attacker.home.parent)
    attacker.stop()
    attacker.write_policy("version: 1\nmcp:\n  servers:\n" + servers_yaml.format(corpus=corpus))
    return corpus


def _list_files(attacker):
    from test_mcp_server import execute, session, text_of

    async def fn(client):
        return await execute(client, "const r = await corpus.list_files({}); r.files.length")
    return text_of(session(attacker, fn))


@NOT_ROOT_OR_ETC
def test_python_m_runs_the_installed_module_not_one_planted_in_the_project(attacker):
    marker = attacker.home / "planted-module-ran"
    base = Path(tempfile.mkdtemp(prefix="envgit-py-"))
    try:
        py = _python_outside(base)
        _mcp_project(attacker, f"    corpus:\n      command: {py}\n"
                               "      args: [-m, mcp_fixture_server, \"{corpus}\"]\n")
        r = attacker.run(f"printf 'open(\"{marker}\", \"w\").close()\\n' > mcp_fixture_server.py && "
                         "mkdir -p json && : > json/__init__.py && "
                         f"printf 'open(\"{marker}\", \"w\").close()\\n' > json/tool.py")
        assert r.returncode == 0, r.stderr
        attacker.envgit("trust", "--yes", check=True)
        out = _list_files(attacker)
        assert not marker.exists(), "envgit mcp ran a module a step planted in the project"
        assert out == "41", out                        # the installed server answered
    finally:
        shutil.rmtree(base, ignore_errors=True)


@NOT_ROOT_OR_ETC
def test_npx_does_not_run_a_bin_planted_in_the_projects_node_modules(attacker):
    if shutil.which("npx") is None:
        pytest.skip("npx is not installed")
    marker = attacker.home / "planted-npx-ran"
    _mcp_project(attacker, "    corpus:\n      command: npx\n"
                           "      args: [--no, envgit-fake-mcp-server]\n")
    r = attacker.run("mkdir -p node_modules/.bin && "
                     f"printf '#!/bin/sh\\ntouch {marker}\\n' > node_modules/.bin/envgit-fake-mcp-server && "
                     "chmod +x node_modules/.bin/envgit-fake-mcp-server")
    assert r.returncode == 0, r.stderr
    attacker.envgit("trust", "--yes", check=True)
    _list_files(attacker)
    assert not marker.exists(), "npx ran the project's node_modules/.bin on the host"


@NOT_ROOT_OR_ETC
def test_an_mcp_server_starts_only_once_trusted(attacker):
    from test_mcp_server import FIXTURE
    marker = attacker.home / "mcp-server-started"
    servers_yaml = ("    corpus:\n      command: /bin/sh\n"
                    f"      args: [-c, 'touch {marker}; exec {sys.executable} {FIXTURE} \"$0\"', \"{{corpus}}\"]\n")
    _mcp_project(attacker, servers_yaml)
    out = _list_files(attacker)
    assert not marker.exists(), "an untrusted MCP server was started"
    assert "corpus" in out, out                       # said: not available, and why
    attacker.envgit("trust", "--yes", check=True)
    assert _list_files(attacker) == "41" and marker.exists()
    marker.unlink()
    _mcp_project(attacker, servers_yaml.replace("touch", "touch -c /dev/null; touch"))
    _list_files(attacker)
    assert not marker.exists(), "a changed MCP server command ran on the old approval"
