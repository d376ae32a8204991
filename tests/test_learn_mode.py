"""Learn mode (issue 28 item 1): `envgit learn -- CMD`, `envgit learn on|off`. What the policy
would deny is let through and recorded with the rule that would have denied it; irreversible
rules, secret paths and credentials' hosts hold exactly as without it; the organisation can
forbid it. Real bwrap, the real gate, a real HTTPS git server and a stub that records every
request it receives (the oracles: what reached the servers, the remote's refs, the journal).

One project is shared by the network checks (its daemon and gate start once); each check
names the step it looks at."""

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import CANARY, ENVGIT, Env, make_home
from gitserver import GitServer, HTTPSServer
from modelserver import Call, ModelServer, agent_bin, claude_env, clone_for_push, codex_config
from uikit import UI

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

REAL = "real-token-9c1e-never-inside"


def _ok(method, path, headers, body):
    return 200, {"Content-Type": "application/json"}, b'{"ok": true}'


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    """(project, git server, stub): a clone of the git server whose policy allows no host at
    all, with a credential for cred.example.test only and a secret directory."""
    base = tmp_path_factory.mktemp("learn")
    with GitServer(root=base / "srv") as git, \
            HTTPSServer(_ok, ("api.example.test", "cred.example.test"), root=base / "stub", ca=git.ca) as stub:
        home = make_home(base)
        env = Env(home, home / "app", {"ENVGIT_RESOLVE": f"{git.resolve},{stub.resolve}",
                                       "ENVGIT_UPSTREAM_CA": str(git.ca.cert_path),
                                       "LEARN_TOKEN": REAL, "XDG_STATE_HOME": str(home / ".state")})
        clone_for_push(env, git)
        (env.root / "secrets").mkdir()
        (env.root / "secrets" / "key").write_text(CANARY + "\n")
        env.write_policy("version: 1\nnetwork:\n  allow: []\nirreversible:\n  - preset: default\n"
                         "filesystem:\n  deny_read: [\"secrets/\"]\n"
                         "credentials:\n  tok:\n    from: {env: LEARN_TOKEN}\n"
                         f"    hosts: [\"cred.example.test:{stub.port}\"]\n")
        env.envgit("trust", "--yes", check=True)
        yield env, git, stub
        env.stop()


def last_step(proj) -> dict:
    return json.loads(proj.envgit("show", "last", "--json", check=True).stdout)


def reached(stub, path) -> list[dict]:
    return [r for r in stub.requests if r["path"].startswith(path)]


def test_a_learn_step_lets_a_host_not_allowed_through_and_records_the_rule(net):
    proj, git, stub = net
    url = stub.url_for("api.example.test")
    r = proj.envgit("run", "--", "curl", "-sf", f"{url}/plain")
    assert r.returncode != 0 and not reached(stub, "/plain"), "without learn mode the host is refused"

    r = proj.envgit("learn", "--", "curl", "-sf", f"{url}/v1/items?page=2")
    assert r.returncode == 0, r.stderr
    assert reached(stub, "/v1/items"), "the GET reached the host"
    assert "LEARN MODE IS ON" in r.stderr and "learn mode was on: 1 request" in r.stderr, r.stderr
    s = last_step(proj)
    assert "learn" in s["marks"]
    rec, = [q for q in s["requests"] if q["path"].startswith("/v1/items")]
    assert rec["decision"] == "allow" and rec["rule"] == "learn", rec
    assert rec["learn"] == {"decision": "deny", "rule": "network.allow", "kind": "",
                            "reason": f"api.example.test:{stub.port} is not in network.allow"}, rec
    with UI(proj) as ui:                # the page says it on the step and on the request
        status, _, page = ui.get(f"/steps/{s['id']}")
    assert status == 200 and "learn mode was on" in page, page[:2000]
    assert "would have been deny" in page and "(would have been network.allow)" in page

    # a client that refuses the gate's certificate sends no request: the tunnel is on record
    r = proj.envgit("learn", "--", "python3", "-c", "import ssl, urllib.request; urllib.request.urlopen("
                    f"'{url}/no-tls', context=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))")
    assert r.returncode != 0 and not reached(stub, "/no-tls")
    step = last_step(proj)["id"]
    for _ in range(50):                 # recorded when the client's connection closes
        tunnel = [q for q in json.loads(proj.envgit("show", str(step), "--json", check=True).stdout)["requests"]
                  if q["method"] == "CONNECT"]
        if tunnel:
            break
        time.sleep(0.1)
    assert tunnel and tunnel[0]["learn"]["rule"] == "network.allow" and tunnel[0]["decision"] == "allow", tunnel

    # git's fetch, through a tunnel learn mode opened: each request inside judged and recorded
    r = proj.envgit("learn", "--", "git", "fetch", "-q", "origin")
    assert r.returncode == 0, r.stderr
    fetched = last_step(proj)["requests"]
    assert fetched and all(q["learn"]["rule"] == "network.allow" for q in fetched), fetched


def test_a_push_is_still_refused_in_learn_mode(net):
    proj, git, stub = net
    before = git.refs()
    r = proj.run("echo x > pushed.txt && git add pushed.txt && git commit -qm pushed")
    assert r.returncode == 0, r.stderr
    r = proj.envgit("learn", "--", "git", "push", "origin", "HEAD:main")
    assert r.returncode != 0 and "preset:default/git-push" in r.stderr, r.stderr
    assert git.refs() == before, "the remote's ref never moved"
    post, = [q for q in last_step(proj)["requests"] if q["method"] == "POST"]
    assert post["decision"] == "deny" and post["rule"] == "preset:default/git-push" and "learn" not in post, post
    # and a raw POST to the same endpoint, not through git
    r = proj.envgit("learn", "--", "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
                    "--data-binary", "x", f"{git.url}/git-receive-pack")
    assert r.stdout.strip() == "403" and git.refs() == before, r.stdout + r.stderr


def test_secrets_stay_unreadable_in_a_learn_step(net):
    proj, _, _ = net
    r = proj.envgit("learn", "--", "sh", "-c", "cat ~/.ssh/id_ed25519 secrets/key ~/.aws/credentials; "
                    "ls -a ~ secrets")
    assert CANARY not in r.stdout + r.stderr
    assert "learn" in last_step(proj)["marks"]


def test_a_credential_goes_only_to_its_hosts_in_learn_mode(net):
    proj, _, stub = net
    api, cred = stub.url_for("api.example.test"), stub.url_for("cred.example.test")
    r = proj.envgit("learn", "--", "sh", "-c",
                    f'curl -s -H "Authorization: Bearer $LEARN_TOKEN" {api}/leak; '
                    f'curl -sf -H "Authorization: Bearer $LEARN_TOKEN" {cred}/own')
    assert r.returncode == 0, r.stderr
    assert not reached(stub, "/leak"), "a placeholder for another host never left"
    own, = reached(stub, "/own")
    assert own["headers"]["authorization"] == f"Bearer {REAL}", "swapped in on the credential's own host"
    assert all(REAL not in repr(q) for q in stub.requests if q["path"] != "/own")
    leak, = [q for q in last_step(proj)["requests"] if q["path"] == "/leak"]
    assert leak["decision"] == "deny" and leak["rule"] == "credential-misuse" and "learn" not in leak, leak
    assert "learn mode was on: 1 request" in r.stderr, "the one learn mode let through"
    assert REAL not in proj.envgit("show", "last", "--json").stdout


def test_learn_on_and_off_for_the_session(net):
    proj, _, stub = net
    url = stub.url_for("api.example.test")
    assert "learn mode is off" in proj.envgit("learn", check=True).stdout
    proj.envgit("learn", "on", check=True)
    assert "learn mode is on" in proj.envgit("learn", check=True).stdout
    first = proj.envgit("run", "--", "curl", "-sf", f"{url}/session-1")
    second = proj.envgit("run", "--", "curl", "-sf", f"{url}/session-2")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert "LEARN MODE IS ON" in first.stderr and "LEARN MODE IS ON" not in second.stderr
    assert "learn mode was on: 1 request" in second.stderr, "every step's summary says it"
    assert "learn" in last_step(proj)["marks"]
    proj.envgit("learn", "off", check=True)
    r = proj.envgit("run", "--", "curl", "-sf", f"{url}/session-3")
    assert r.returncode != 0 and not reached(stub, "/session-3")
    assert "learn" not in last_step(proj)["marks"] and "learn mode" not in r.stderr


def test_claude_learn_runs_the_agents_whole_session_in_learn_mode(proj, tmp_path):
    """`envgit claude --learn`: the real Claude Code, driven by the scripted model; its Bash
    call reaches a host the policy does not allow, and every step of the session says so."""
    claude_bin = agent_bin("claude")
    model_host = "model.example.test"
    with HTTPSServer(_ok, ("api.example.test",), root=tmp_path / "stub") as stub, \
            ModelServer([Call("Bash", {"command": f"curl -sf {stub.url_for()}/from-claude",
                                       "description": "scripted"})]) as model:
        proj.stop()
        proj.env.update(ENVGIT_RESOLVE=f"{model_host}=127.0.0.1,{stub.resolve}",
                        ENVGIT_UPSTREAM_CA=str(stub.ca.cert_path))
        proj.write_policy(f'version: 1\nnetwork:\n  allow: ["{model_host}:{model.port}"]\n'
                          "irreversible:\n  - preset: default\n")
        r = subprocess.run([ENVGIT, "claude", "--learn", "-p", "go", "--dangerously-skip-permissions",
                            "--output-format", "stream-json", "--verbose"], cwd=proj.root,
                           env={**proj.env, **claude_env(f"http://{model_host}:{model.port}"),
                                "ENVGIT_CLAUDE_BIN": claude_bin},
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr[-2000:]
        assert reached(stub, "/from-claude"), "the Bash call's curl went through"
    assert "LEARN MODE IS ON for this Claude session" in r.stderr
    steps = json.loads(proj.envgit("log", "--json", check=True).stdout)
    session = [s for s in steps if s["session"].startswith("claude-")]
    assert len(session) >= 2 and all("learn" in s["marks"] for s in session), session
    curl, = [q for s in session for q in s["requests"] if q["path"] == "/from-claude"]
    assert curl["learn"]["rule"] == "network.allow", curl
    assert "learn mode is off" in proj.envgit("learn", check=True).stdout, "it ended with the session"


def test_codex_learn_runs_the_agents_whole_session_in_learn_mode(proj, tmp_path):
    """`envgit codex --learn`: the real Codex (envgit its exec-server), the scripted model; its
    shell call reaches a host the policy does not allow."""
    codex_bin = agent_bin("codex")
    (proj.home / ".codex").mkdir(exist_ok=True)
    with HTTPSServer(_ok, ("api.example.test",), root=tmp_path / "stub") as stub, \
            ModelServer([Call("exec_command", {"cmd": f"curl -sf {stub.url_for()}/from-codex"})]) as model:
        (proj.home / ".codex" / "config.toml").write_text(codex_config(model.url))
        proj.stop()
        proj.env.update(ENVGIT_RESOLVE=stub.resolve, ENVGIT_UPSTREAM_CA=str(stub.ca.cert_path))
        r = subprocess.run([ENVGIT, "codex", "--learn", "exec", "--skip-git-repo-check", "go"],
                           cwd=proj.root, env={**proj.env, "ENVGIT_CODEX_BIN": codex_bin},
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr[-2000:]
        assert reached(stub, "/from-codex"), "the shell call's curl went through"
    assert "LEARN MODE IS ON for this Codex session" in r.stderr
    ran, = [s for s in json.loads(proj.envgit("log", "--json", check=True).stdout)
            if s["session"].startswith("codex-") and "curl" in " ".join(s["argv"])]
    assert "learn" in ran["marks"] and ran["requests"][0]["learn"]["rule"] == "network.allow", ran
    assert "learn mode is off" in proj.envgit("learn", check=True).stdout, "it ended with the session"


def org_file(text) -> str:
    """An organisation policy as root installs it: root-owned, readable by all."""
    d = tempfile.mkdtemp(prefix="envgit-org-")
    os.chmod(d, 0o755)
    p = os.path.join(d, "policy.yaml")
    Path(p).write_text(text)
    return p


@pytest.mark.skipif(os.geteuid() != 0, reason="an organisation policy file must be root's")
def test_the_organisation_can_forbid_learn_mode(proj):
    if os.path.exists("/etc/envgit/policy.yaml"):
        pytest.skip("/etc/envgit/policy.yaml exists here: $ENVGIT_ORG_POLICY is not read")
    org = org_file("version: 1\nlearn: forbid\n")
    proj.stop()
    proj.env["ENVGIT_ORG_POLICY"] = org
    r = proj.envgit("learn", "--", "sh", "-c", "echo ran > ran.txt")
    assert r.returncode == 125 and not (proj.root / "ran.txt").exists(), r.stderr
    assert f"learn mode is forbidden by the organisation's policy ({org}:2" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    r = proj.envgit("learn", "on")
    assert r.returncode == 2 and "forbidden" in r.stderr, r.stderr
    r = proj.envgit("codex", "--learn", "exec", "hi", env={"ENVGIT_CODEX_BIN": "/bin/true"})
    assert r.returncode == 2 and "forbidden" in r.stderr, r.stderr  # before the agent starts
    assert "learn mode is off" in proj.envgit("learn", check=True).stdout
    assert proj.run("echo plain > plain.txt").returncode == 0      # steps without it still run
    # a project cannot undo it
    proj.write_policy((proj.root / "envgit.yaml").read_text() + "learn: allow\n")
    r = proj.envgit("policy", "check")
    assert r.returncode != 0 and "forbids (learn: forbid)" in r.stdout + r.stderr, r.stdout + r.stderr
    subprocess.run(["rm", "-rf", os.path.dirname(org)], check=True)
