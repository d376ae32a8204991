"""The organisation policy (policy/org.py): every envgit.yaml is loaded under it; a project can
tighten it and never loosen it, and a loosening is an error naming both files and lines.
Loaded through the real `load_policy` and the real CLI (`envgit policy show/check`); the steps
that run under it are in test_org_policy_steps.py."""

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest

from conftest import ENVGIT
from envgit.policy import PolicyError, load_policy
from envgit.policy.org import ORG_POLICY_ENV

ORG = """\
version: 1
network:
  allow: [pypi.org]
  deny:
    - evil.example
    - "*.bad.example"
  ask_timeout: 60
  l7:
    api.example.com: {methods: [GET, HEAD], paths: ["/v1/**"]}
env:
  deny: [AWS_*]
  set: {CORP_MIRROR: "https://mirror.corp.example"}
filesystem:
  deny_read:
    - "~/corp-secrets"
    - "**/*.key"
irreversible:
  - preset: default
    action: ask
  - net: {host: deploy.corp.example, method: POST}
    action: deny
snapshot:
  max_file_size: 1MiB
mcp:
  max_return_bytes: 4096
"""


def org_file(text=ORG, mode=0o644) -> str:
    """An organisation policy as root would install it: root-owned, in a root-owned directory
    readable by all (the unprivileged user's daemon reads it too)."""
    d = tempfile.mkdtemp(prefix="envgit-org-")
    os.chmod(d, 0o755)
    p = os.path.join(d, "policy.yaml")
    Path(p).write_text(text)
    os.chmod(p, mode)
    return p


@pytest.fixture
def org(monkeypatch):
    if os.path.lexists("/etc/envgit/policy.yaml"):
        pytest.skip("this machine has a real organisation policy in /etc/envgit")
    if os.geteuid() != 0:
        pytest.skip("an organisation policy must be owned by root: the test writes one as root")
    p = org_file()
    monkeypatch.setenv(ORG_POLICY_ENV, p)
    yield p
    shutil.rmtree(os.path.dirname(p), ignore_errors=True)


def project(tmp_path, text) -> Path:
    f = tmp_path / "envgit.yaml"
    f.write_text(textwrap.dedent(text))
    return f


def line_of(text, needle, nth=1):
    lines = text.splitlines()
    hits = [i + 1 for i, ln in enumerate(lines) if needle in ln]
    return hits[nth - 1]


# --- a loosening is an error naming both files and lines --------------------------------------

LOOSENINGS = [
    # (project policy, the project line's needle, the org line's needle, words in the message)
    ("network:\n  allow: [github.com, evil.example]\n", "allow:", "evil.example",
     ["network.allow adds evil.example", "denies"]),
    ("network:\n  allow:\n    - \"*.example\"\n", "*.example", "evil.example",
     ["network.allow *.example covers evil.example", "name the hosts"]),
    ("network:\n  allow:\n    - \"x.bad.example:8443\"\n", "x.bad.example", "*.bad.example",
     ["network.allow adds x.bad.example:8443"]),
    ("network:\n  ask_timeout: 600\n", "ask_timeout", "ask_timeout", ["ask_timeout is 600 s"]),
    ("network:\n  l7:\n    api.example.com: {methods: [GET, POST]}\n", "api.example.com",
     "api.example.com", ["allows method POST"]),
    ("network:\n  l7:\n    api.example.com: {methods: [GET], paths: [\"/**\"]}\n", "api.example.com",
     "api.example.com", ["allows path /**"]),
    ("irreversible:\n  - net: {host: api.example.com, method: POST, path: /v1/x}\n    action: ask\n",
     "net:", "api.example.com", ["lets method POST on api.example.com through"]),
    ("irreversible:\n  - net: {host: api.example.com, method: GET, path: /v2/x}\n    action: allow\n",
     "net:", "api.example.com", ["lets path /v2/x on api.example.com through"]),
    ("env:\n  pass:\n    - AWS_SECRET_ACCESS_KEY\n", "AWS_SECRET", "AWS_*",
     ["env.pass passes AWS_SECRET_ACCESS_KEY"]),
    ("env:\n  set: {CORP_MIRROR: \"https://evil.example\"}\n", "CORP_MIRROR", "CORP_MIRROR",
     ["env.set changes CORP_MIRROR"]),
    ("filesystem:\n  allow_read:\n    - \"~/corp-secrets/token\"\n", "corp-secrets", "corp-secrets",
     ["re-opens ~/corp-secrets/token"]),
    ("filesystem:\n  allow_read:\n    - deploy/prod.key\n", "prod.key", "*.key",
     ["re-opens deploy/prod.key"]),
    ("irreversible:\n  - rule: git-push\n    action: allow\n", "git-push", "preset: default",
     ["preset rule git-push allow-and-mark", "makes ask"]),
    ("irreversible:\n  - preset: default\n    action: allow\n", "preset: default", "preset: default",
     ["allow-and-mark"]),
    ("irreversible:\n  - preset: default\n    disable: [npm-publish]\n", "preset: default",
     "preset: default", ["npm-publish not apply"]),
    ("irreversible:\n  - net: {host: github.com, method: POST}\n    action: allow\n", "net:",
     "preset: default", ["can match requests before preset rule git-push"]),
    ("snapshot:\n  max_file_size: 1KiB\n", "max_file_size", "max_file_size", ["record less"]),
    ("mcp:\n  max_return_bytes: 1000000\n", "max_return_bytes", "max_return_bytes",
     ["mcp.max_return_bytes"]),
    ("credentials:\n  gh:\n    from: {env: AWS_TOKEN}\n    hosts: [api.github.com]\n", "AWS_TOKEN",
     "AWS_*", ["credential gh reads AWS_TOKEN"]),
    ("credentials:\n  gh:\n    from: {env: GH_TOKEN}\n    hosts: [evil.example]\n", "hosts:",
     "evil.example", ["credential gh is sent to evil.example"]),
]


@pytest.mark.parametrize("body,pneedle,oneedle,words", LOOSENINGS,
                         ids=[w[0].split()[0] for *_, w in LOOSENINGS])
def test_a_loosening_project_is_an_error_naming_both(org, tmp_path, body, pneedle, oneedle, words):
    text = "version: 1\n" + body
    f = project(tmp_path, text)
    with pytest.raises(PolicyError) as e:
        load_policy(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}:{line_of(text, pneedle)}:"), msg
    assert f"{org}:{line_of(ORG, oneedle)}" in msg, msg
    for w in words:
        assert w in msg, msg


def test_without_the_org_policy_the_same_projects_load(tmp_path):
    """The control: each of those project files is valid on its own (the error above is the
    organisation's, not a typo)."""
    for body, *_ in LOOSENINGS:
        load_policy(project(tmp_path, "version: 1\n" + body))


def test_the_env_var_cannot_hide_an_org_policy_in_etc(monkeypatch, tmp_path):
    """$ENVGIT_ORG_POLICY is read only when /etc/envgit/policy.yaml does not exist: it adds an
    organisation policy, never replaces one (org.locate)."""
    from envgit.policy import org as orgmod
    real = org_file()
    monkeypatch.setattr(orgmod, "ORG_POLICY_PATH", real)
    monkeypatch.setenv(ORG_POLICY_ENV, org_file("version: 1\n"))
    assert orgmod.locate() == real
    monkeypatch.setenv(ORG_POLICY_ENV, "")
    assert orgmod.locate() == real


# --- tightening works, and the strictest value applies ----------------------------------------

def test_a_tightening_project_loads_with_the_strictest_values(org, tmp_path):
    f = project(tmp_path, """\
        version: 1
        network:
          allow: [github.com]
          deny: [gist.github.com]
          ask_timeout: 30
          l7:
            api.example.com: {methods: [GET], paths: ["/v1/public/**"]}
        env:
          pass: [MY_VAR]
        filesystem:
          deny_read: ["~/other"]
          allow_read: ["~/.config/tool"]
        irreversible:
          - preset: default
            action: deny
          - net: {host: api.other.example, method: DELETE}
            action: ask
        shell:
          - deny: ["rm -rf /"]
        snapshot:
          max_file_size: 10MiB
        """)
    pol = load_policy(f)
    assert pol.org_path == org and pol.org_sha256
    assert pol.network_allow == ["pypi.org", "github.com"]
    assert pol.network_deny == ["evil.example", "*.bad.example", "gist.github.com"]
    assert pol.ask_timeout == 30
    assert pol.l7["api.example.com"] == {"methods": ["GET"], "paths": ["/v1/public/**"]}
    assert "MY_VAR" in pol.env_pass and pol.env_set == {"CORP_MIRROR": "https://mirror.corp.example"}
    assert {"~/corp-secrets", "**/*.key", "~/other"} <= set(pol.deny_read)
    assert pol.max_file_size == 10 * 1024**2
    assert pol.shell == [{"deny": ["rm -rf /"]}]
    assert pol.mcp["max_return_bytes"] == 4096
    rules = pol.irreversible
    # denied hosts first, then the org's request rules, then the project's, then every preset
    # rule at the stricter action: the project's deny
    assert [r.get("name") for r in rules[:3]] == ["network.deny evil.example",
                                                  "network.deny *.bad.example",
                                                  "network.deny gist.github.com"]
    assert rules[3] == {"net": {"host": "deploy.corp.example", "method": "POST"}, "action": "deny"}
    assert rules[4] == {"net": {"host": "api.other.example", "method": "DELETE"}, "action": "ask"}
    assert {r["action"] for r in rules[5:]} == {"deny"} and all("rule" in r for r in rules[5:])


def test_org_decisions_apply_to_requests(org, tmp_path):
    """What the gate decides under the merged policy (the real gate: test_org_policy_steps)."""
    from envgit.policy.network import Request, decide_request, judge_connect
    pol = load_policy(project(tmp_path, "version: 1\nnetwork:\n  allow: [\"*.corp.example\"]\n"))

    def req(method, host, path="/", body=b""):
        return Request(method=method, scheme="https", host=host, port=443, path=path,
                       headers={"host": host}, body=body)
    assert judge_connect(pol, "deploy.corp.example", 443).intercept
    assert decide_request(pol, req("POST", "deploy.corp.example", "/go")).action == "deny"
    assert decide_request(pol, req("GET", "deploy.corp.example", "/go")).action == "allow"
    # the org's preset at ask: a push is asked about, neither denied nor let through
    push = b"%04x" % (4 + 83 + 18) + b"1" * 40 + b" " + b"2" * 40 + b" refs/heads/main\0\n0000"
    d = decide_request(pol, req("POST", "git.corp.example", "/r.git/git-receive-pack", push))
    assert d.action == "ask", d


def test_the_orgs_own_rule_order_is_kept(org, tmp_path, monkeypatch):
    """First match wins within the organisation's lists, as in any policy: its allow of one
    path before its deny of the rest still allows that path; a project's later rule cannot
    reach a request the org's rules match."""
    from envgit.mcp.rules import decide_tool
    from envgit.policy.network import Request, decide_request
    monkeypatch.setenv(ORG_POLICY_ENV, org_file(
        "version: 1\nirreversible:\n"
        "  - net: {host: hooks.example.com, method: POST, path: /hook}\n    action: allow\n"
        "  - net: {host: hooks.example.com, method: POST}\n    action: deny\n"
        "mcp:\n  rules:\n    - {server: corp, action: allow}\n    - {action: deny}\n"))
    pol = load_policy(project(tmp_path, """\
        version: 1
        network:
          allow: [hooks.example.com]
        irreversible:
          - net: {host: hooks.example.com, method: POST, path: /other}
            action: allow
        mcp:
          rules:
            - {server: corp, tool: "delete_*", action: deny}
        """))

    def post(path):
        return decide_request(pol, Request(method="POST", scheme="https", host="hooks.example.com",
                                           port=443, path=path, headers={"host": "hooks.example.com"},
                                           body=b"x")).action
    assert (post("/hook"), post("/other"), post("/x")) == ("allow", "deny", "deny")
    assert decide_tool(pol.mcp["rules"], "corp", "list").action == "allow"
    assert decide_tool(pol.mcp["rules"], "other", "list").action == "deny"


def test_an_empty_project_inherits_the_org(org, tmp_path):
    pol = load_policy(project(tmp_path, "version: 1\n"))
    assert pol.ask_timeout == 60 and pol.max_file_size == 1024**2
    assert {r.get("action") for r in pol.irreversible if "rule" in r} == {"ask"}
    assert pol.where["network.ask_timeout"] == f"{org}:{line_of(ORG, 'ask_timeout')}"


def test_env_deny_drops_a_default_pass(org, tmp_path):
    p = org_file(ORG.replace("deny: [AWS_*]", "deny: [AWS_*, LESS, LC_*]"))
    os.environ[ORG_POLICY_ENV] = p
    pol = load_policy(project(tmp_path, "version: 1\n"))
    assert "LESS" not in pol.env_pass and "LC_*" not in pol.env_pass and "PATH" in pol.env_pass
    assert len(pol.env_pass) == len([k for k in pol.where if k.startswith("env.pass[")])


# --- trust: root-owned, nobody else can write, not in the project, never quietly skipped ------

def _refused(tmp_path, monkeypatch, path, words):
    monkeypatch.setenv(ORG_POLICY_ENV, path)
    with pytest.raises(PolicyError) as e:
        load_policy(project(tmp_path, "version: 1\n"))
    for w in words:
        assert w in str(e.value), str(e.value)


def test_an_org_file_others_can_write_is_refused(org, tmp_path, monkeypatch):
    _refused(tmp_path, monkeypatch, org_file(mode=0o666), ["refused", "writable by everyone"])
    p = org_file()
    os.chown(p, 65534, -1)
    _refused(tmp_path, monkeypatch, p, ["refused", "owned by uid 65534"])
    p = org_file()
    os.chmod(os.path.dirname(p), 0o777)
    _refused(tmp_path, monkeypatch, p, ["refused", "directory", "writable by everyone"])


def test_a_symlink_to_a_writable_file_is_refused(org, tmp_path, monkeypatch):
    target = org_file(mode=0o644)
    os.chown(target, 65534, -1)
    link = os.path.join(os.path.dirname(org_file()), "link.yaml")
    os.symlink(target, link)
    _refused(tmp_path, monkeypatch, link, ["owned by uid 65534"])


def test_a_missing_or_bad_org_file_refuses_instead_of_being_skipped(org, tmp_path, monkeypatch):
    _refused(tmp_path, monkeypatch, "/nonexistent/envgit/policy.yaml", ["does not exist"])
    _refused(tmp_path, monkeypatch, "relative/policy.yaml", ["must be absolute"])
    _refused(tmp_path, monkeypatch, org_file("version: 1\nnetwork:\n  alow: []\n"),
             ["unknown key 'alow'", ":3:"])
    inside = tmp_path / "org.yaml"
    inside.write_text("version: 1\n")
    _refused(tmp_path, monkeypatch, str(inside), ["inside the project"])


# --- the CLI: policy show's provenance, policy check's error ----------------------------------

def _cli(proj, org, *args):
    return subprocess.run([ENVGIT, *args], cwd=proj.root, capture_output=True, text=True,
                          env={**proj.env, ORG_POLICY_ENV: org}, timeout=60)


def test_policy_show_says_where_each_value_came_from(proj, org):
    proj.write_policy("version: 1\nnetwork:\n  allow: [github.com]\n  ask_timeout: 30\n")
    r = _cli(proj, org, "policy", "show")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"loaded under the organisation policy {org}" in out
    lines = {ln.split("#")[0].strip(" -"): ln.rsplit("#", 1)[1].strip() for ln in out.splitlines()
             if "#" in ln and not ln.startswith("#")}
    assert lines["pypi.org"] == f"{org}:3"
    assert lines["github.com"] == f"{proj.root}/envgit.yaml:3"
    assert lines["evil.example"] == f"{org}:{line_of(ORG, 'evil.example')}"
    assert lines["~/corp-secrets"] == f"{org}:{line_of(ORG, 'corp-secrets')}"
    assert lines["~/.ssh"] == "default"
    assert lines["network.ask_timeout: 30"] == f"{proj.root}/envgit.yaml:4"
    assert lines["irreversible: " + json.dumps(load_policy_for(proj, org).irreversible)] == \
        f"{org}:{line_of(ORG, 'preset: default')}"
    j = json.loads(_cli(proj, org, "policy", "show", "--json").stdout)
    assert j["org_path"] == org and j["where"]["network.allow[0]"] == f"{org}:3"


def load_policy_for(proj, org):
    old = os.environ.get(ORG_POLICY_ENV)
    os.environ[ORG_POLICY_ENV] = org
    try:
        return load_policy(proj.root / "envgit.yaml")
    finally:
        if old is None:
            del os.environ[ORG_POLICY_ENV]
        else:
            os.environ[ORG_POLICY_ENV] = old


def test_policy_check_refuses_a_loosening_in_one_line(proj, org):
    proj.write_policy("version: 1\nnetwork:\n  allow:\n    - github.com\n    - evil.example\n")
    r = _cli(proj, org, "policy", "check")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert line.startswith(f"envgit: {proj.root}/envgit.yaml:5:"), line
    assert f"which {org}:{line_of(ORG, 'evil.example')} denies" in line, line
