"""A person's own defaults (issue 26): `~/.config/envgit/policy.yaml` ($XDG_CONFIG_HOME
respected) read under every project's envgit.yaml, with the organisation's still above both
(policy/userdefaults.py). Through the real CLI: a host the person allows everywhere is reached
by a step of a project that does not name it, `policy show` says which file and line each value
came from, a project's single value wins over the person's, an organisation rule binds a
person's default as it binds a project's, and the daemon re-reads the file when it changes."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import Env, make_home
from envgit.policy.org import ORG_POLICY_ENV


def _project(tmp_path, policy="version: 1\n", extra_env=None) -> Env:
    home = make_home(tmp_path)
    root = home / "proj"
    root.mkdir()
    env = Env(home, root, extra_env)
    env.envgit("init", check=True)
    env.write_policy(policy)
    return env


def _defaults(env: Env, text: str, config=None) -> Path:
    d = Path(config) if config else env.home / ".config"
    p = d / "envgit" / "policy.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def _show(env: Env) -> dict:
    return json.loads(env.envgit("policy", "show", "--json", check=True).stdout)


@pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")
def test_a_host_the_person_allows_is_reached_with_no_project_entry_until_they_remove_it(tmp_path):
    from test_daily_network import DevServer
    with DevServer() as dev:
        env = _project(tmp_path)
        try:
            r = env.run(f"curl -sS -m 5 http://127.0.0.1:{dev.port}/before; echo done")
            assert dev.hits == [] and "done" in r.stdout, r.stdout + r.stderr
            mine = _defaults(env, f'version: 1\nnetwork:\n  allow: ["127.0.0.1:{dev.port}"]\n')
            # the daemon that judged the first step re-reads the policy: the person's file changed
            r = env.run(f"curl -sS http://127.0.0.1:{dev.port}/mine")
            assert r.returncode == 0 and f"dev server {dev.port}" in r.stdout, r.stdout + r.stderr
            assert dev.hits == ["/mine"]
            shown = env.envgit("policy", "show", check=True).stdout
            line = next(ln for ln in shown.splitlines() if f"127.0.0.1:{dev.port}" in ln)
            assert line.rstrip().endswith(f"# {mine}:3"), shown
            assert f"# read over your defaults {mine}" in shown, shown
            pol = _show(env)
            assert pol["user_path"] == str(mine) and len(pol["user_sha256"]) == 64
            # gone from the person's file: unreachable again from the next step
            mine.write_text("version: 1\n")
            env.run(f"curl -sS -m 5 http://127.0.0.1:{dev.port}/after; echo done")
            assert dev.hits == ["/mine"]
        finally:
            env.stop()


def test_lists_are_the_persons_then_the_projects_and_a_project_single_value_wins(tmp_path):
    env = _project(tmp_path, "version: 1\nnetwork:\n  allow: [example.org]\n  ask_timeout: 45\n"
                             "env:\n  pass: [PROJECT_VAR]\n  set: {SHARED: project, P_ONLY: p}\n")
    mine = _defaults(env, "version: 1\nnetwork:\n  allow: [\"preset:pypi\"]\n  ask_timeout: 20\n"
                          "env:\n  pass: [MY_VAR]\n  set: {SHARED: mine, U_ONLY: u}\n"
                          "snapshot:\n  max_file_size: 1MiB\n")
    proj = env.root / "envgit.yaml"
    pol = _show(env)
    assert pol["network_allow"] == ["pypi.org", "files.pythonhosted.org", "example.org"]
    w = pol["where"]
    assert [w[f"network.allow[{i}]"] for i in range(3)] == [f"{mine}:3", f"{mine}:3", f"{proj}:3"]
    assert pol["ask_timeout"] == 45 and w["network.ask_timeout"] == f"{proj}:4"
    assert pol["max_file_size"] == 1 << 20 and w["snapshot.max_file_size"] == f"{mine}:9"
    assert pol["env_pass"][-2:] == ["MY_VAR", "PROJECT_VAR"]
    assert pol["env_set"] == {"SHARED": "project", "U_ONLY": "u", "P_ONLY": "p"}
    shown = env.envgit("policy", "show", check=True).stdout
    assert f"network.ask_timeout: 45  # {proj}:4" in shown, shown
    assert f"snapshot.max_file_size: 1048576  # {mine}:9" in shown, shown


def test_a_persons_rule_adjusts_the_default_preset_and_a_projects_rule_decides_first(tmp_path):
    env = _project(tmp_path, "version: 1\n")
    _defaults(env, "version: 1\nirreversible:\n  - rule: git-push\n    action: ask\n"
                   "  - net: {host: api.example.com, method: POST}\n    action: allow\n")
    pol = _show(env)
    # no irreversible list in the project: the default preset, the person's override on it
    assert {"preset": "default"} in pol["irreversible"]
    assert {"rule": "git-push", "action": "ask"} in pol["irreversible"]
    env.write_policy("version: 1\nirreversible:\n  - preset: default\n"
                     "  - net: {host: api.example.com, method: POST}\n    action: deny\n")
    nets = [e for e in _show(env)["irreversible"] if "net" in e]
    assert [e["action"] for e in nets] == ["deny", "allow"]    # first match wins: the project's


def test_xdg_config_home_names_the_persons_file(tmp_path):
    xdg = tmp_path / "xdg"
    env = _project(tmp_path, extra_env={"XDG_CONFIG_HOME": str(xdg)})
    _defaults(env, "version: 1\nnetwork:\n  allow: [ignored.example]\n")        # ~/.config: not read
    mine = _defaults(env, "version: 1\nnetwork:\n  allow: [mine.example]\n", config=xdg)
    pol = _show(env)
    assert pol["network_allow"] == ["mine.example"] and pol["user_path"] == str(mine)


def test_an_error_in_the_persons_file_names_it_and_refuses_every_step(tmp_path):
    env = _project(tmp_path)
    mine = _defaults(env, "version: 1\nnetwork:\n  allow: [\"preset:pipy\"]\n  alow: []\n")
    r = env.envgit("policy", "check")
    assert r.returncode == 2, r.stdout + r.stderr
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith(f"envgit: {mine}:")]
    assert [e.split(":")[2:4] for e in errs] == [["3", "11"], ["4", "3"]], r.stderr
    r = env.run("echo should-not-run")
    assert "should-not-run" not in r.stdout and f"{mine}:3:11" in r.stderr, r.stdout + r.stderr


def test_the_persons_file_is_refused_when_others_can_write_it_or_it_lies_in_the_project(tmp_path):
    env = _project(tmp_path)
    mine = _defaults(env, "version: 1\n")
    mine.chmod(0o666)
    r = env.envgit("policy", "check")
    assert r.returncode == 2 and "writable by everyone" in r.stderr, r.stderr
    mine.chmod(0o644)
    inside = env.root / "conf"
    _defaults(env, "version: 1\n", config=inside)
    r = env.envgit("policy", "check", env={"XDG_CONFIG_HOME": str(inside)})
    assert r.returncode == 2 and "inside the project" in r.stderr, r.stderr


@pytest.fixture
def org():
    if os.path.lexists("/etc/envgit/policy.yaml"):
        pytest.skip("this machine has a real organisation policy in /etc/envgit")
    if os.geteuid() != 0:
        pytest.skip("an organisation policy must be owned by root: the test writes one as root")
    d = tempfile.mkdtemp(prefix="envgit-org-")
    os.chmod(d, 0o755)
    p = Path(d) / "policy.yaml"
    p.write_text("version: 1\nnetwork:\n  deny: [evil.example]\n  ask_timeout: 60\n")
    p.chmod(0o644)
    yield p
    shutil.rmtree(d, ignore_errors=True)


def test_an_org_rule_binds_a_persons_default_as_it_binds_a_project_value(tmp_path, org):
    env = _project(tmp_path, extra_env={ORG_POLICY_ENV: str(org)})
    try:
        mine = _defaults(env, "version: 1\nnetwork:\n  allow: [github.com, evil.example]\n")
        r = env.envgit("policy", "check")
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"{mine}:3:" in r.stderr and "network.allow adds evil.example" in r.stderr, r.stderr
        assert f"{org}:3" in r.stderr, r.stderr
        r = env.run("echo should-not-run")
        assert "should-not-run" not in r.stdout and f"{mine}:3:" in r.stderr, r.stdout + r.stderr
        mine.write_text("version: 1\nnetwork:\n  ask_timeout: 600\n")    # longer than the org's
        r = env.envgit("policy", "check")
        assert r.returncode == 2 and f"{mine}:3:" in r.stderr and "ask_timeout is 600" in r.stderr
        mine.write_text("version: 1\nnetwork:\n  allow: [github.com]\n  ask_timeout: 30\n")
        pol = _show(env)
        assert pol["network_allow"] == ["github.com"] and pol["ask_timeout"] == 30
        assert pol["org_path"] == str(org) and pol["where"]["network.ask_timeout"] == f"{mine}:4"
    finally:
        env.stop()


def test_the_documented_example_loads_as_a_persons_defaults(tmp_path):
    import re
    doc = (Path(__file__).resolve().parent.parent / "docs" / "POLICY.md").read_text()
    (example,) = re.findall(r"```yaml defaults\n(.*?)```", doc, re.S)
    env = _project(tmp_path)
    mine = _defaults(env, example)
    r = env.envgit("policy", "check", check=True)
    assert f"read over your defaults {mine}" in r.stdout, r.stdout
    pol = _show(env)
    assert "pypi.org" in pol["network_allow"] and "localhost:5173" in pol["network_allow"]
    assert {"rule": "git-push", "action": "ask"} in pol["irreversible"]
