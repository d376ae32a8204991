"""`envgit demo` end to end: it passes here, and it fails, naming the claim, when a promise
is broken on purpose."""

import json
import os
import subprocess

from conftest import ENVGIT


def demo(*args, tmp_path):
    return subprocess.run([ENVGIT, "demo", *args], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"})


def test_demo_proves_its_three_promises(tmp_path):
    r = demo(tmp_path=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "[remote rejected] main -> main" in out
    assert "envgit: denied POST git.demo.test/app.git/git-receive-pack (git push)" in out
    assert "ok  gate:" in out and "ok  rewind:" in out and "ok  audit:" in out
    assert "\033[" not in out                         # plain text when piped
    assert not list(tmp_path.iterdir())               # cleaned up (its temp dir is elsewhere)


def test_demo_fails_when_the_push_is_allowed(tmp_path):
    pol = tmp_path / "allow-push.yaml"
    # the demo's own policy with the push rule switched to allow: the gate promise is broken
    pol.write_text("version: 1\nnetwork:\n  allow: ['{remote}']\nirreversible:\n"
                   "  - preset: default\n  - rule: git-push\n    action: allow\n")
    r = demo("--policy", str(pol), tmp_path=tmp_path)
    assert r.returncode == 1
    assert "FAILED: the remote's main is unchanged" in r.stderr
    assert "ok  gate:" not in r.stdout


def test_demo_json_and_keep(tmp_path):
    keep = tmp_path / "kept"
    r = demo("--json", "--keep", str(keep), tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    records = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert [x["step"] for x in records if "step" in x] == [1, 2, 3, 4]
    assert records[-1]["result"] == "ok"
    push = next(x for x in records if x.get("step") == 3)
    assert any(q["decision"] == "deny" and "receive-pack" in q["path"] for q in push["requests"])
    app = keep / "app"
    log = subprocess.run([ENVGIT, "log", "--json"], cwd=app, capture_output=True, text=True)
    assert len(json.loads(log.stdout)) == 5
    assert (app / "greet.js").exists()
    subprocess.run([ENVGIT, "daemon", "stop"], cwd=app, capture_output=True)
