"""`envgit stats`: the figures match the asks made. Real steps through the real gate (the
fixture of test_grants.py); answers from the CLI, from the daemon's `answer` op with
`how: ui` (what `envgit ui` sends), a grant, a timeout; an MCP ask answered by the agent's
client recorded through the daemon's `event` op, as the MCP server (mcp/execution.py) does."""

import json

from test_grants import CURL, Person, grants_world  # noqa: F401  (the fixture `world`)


def _answer_as_ui(env, remember=None):
    """The page's way: the daemon's answer op with how "ui" (and the remember field)."""
    import subprocess
    import sys
    code = ("import json,os,sys; from envgit.paths import find_project; from envgit.daemon.client import connect\n"
            "c = connect(find_project(), start=False)\n"
            "a = c.request({'op': 'pending'})['asks'][0]\n"
            f"r = c.request({{'op': 'answer', 'id': a['id'], 'answer': 'allow', 'uid': os.getuid(), 'how': 'ui', "
            f"'remember': {remember!r}}})\n"
            "print(json.dumps(r))")
    return subprocess.run([sys.executable, "-c", code], cwd=env.root, env=env.env, capture_output=True,
                          text=True, timeout=60)


def test_stats_count_the_asks_by_channel_grants_denials_and_irreversible_allows(world):
    w, env = world, world.env
    post = f"{CURL} -X POST --data-binary x"
    # 1: approved and remembered at the CLI; 2: the grant, then a deny at the CLI
    with Person(env, lambda q: ["approve", "--remember"]):
        assert env.run(f"{post} {w.url()}").stdout.split() == ["200"]
    with Person(env, lambda q: ["deny"]):
        assert env.run(f"{post} {w.url()}; {post} {w.url(path='/api/two')}").stdout.split() == ["200", "403"]
    # 3: answered from the page (the daemon op with how "ui"), remembered for a minute
    import threading
    import time
    replies = []

    def ui():
        for _ in range(300):
            r = env.envgit("pending", "--json")
            if json.loads(r.stdout or "[]"):
                replies.append(_answer_as_ui(env, {"for_s": 60}))
                return
            time.sleep(0.1)
    t = threading.Thread(target=ui)
    t.start()
    assert env.run(f"{post} {w.url(path='/api/three')}").stdout.split() == ["200"]
    t.join(60)
    reply = json.loads(replies[0].stdout)
    assert reply["grant"]["id"] == "g2" and reply["grant"]["how"] == "ui", replies[0]
    assert reply["grant"]["expires_at"] - reply["grant"]["at"] == 60
    # 4: nobody answers: a timeout
    env.write_policy((env.root / "envgit.yaml").read_text().replace("ask_timeout: 15", "ask_timeout: 1"))
    assert env.run(f"{post} {w.url(path='/api/four')}").stdout.split() == ["403"]
    # 5: an MCP tool call's ask answered by the agent's client (elicitation), as recorded by it
    _mcp_elicited(env)

    s = json.loads(env.envgit("stats", "--json", check=True).stdout)
    assert s["asks"] == 5 and s["grants_used"] == 1 and s["grant_uses"] == {"g1": 1}, s
    how = s["answered_how"]
    assert (how["cli"], how["ui"], how["grant"], how["timeout"], how["elicitation"]) == (2, 1, 1, 1, 1), how
    user = [k for k in s["answered_by"] if k not in ("timeout", "agent-client")]
    assert len(user) == 1 and s["answered_by"] == {user[0]: 3, "timeout": 1, "agent-client": 1}, s
    assert s["answers"] == {"allow": 4, "deny": 2}, s          # the grant's use is an allow
    assert s["denials"] == 2 and s["irreversible_allows"] == 3, s
    assert sum(h["asks"] for h in s["asks_per_hour"]) == 5 and s["steps_asked"] == 5
    text = env.envgit("stats", check=True).stdout
    assert "5 asks of a person" in text and "1 allowed by grants" in text and "elicitation 1" in text
    later = json.loads(env.envgit("stats", "--since", "2999-01-01", "--json", check=True).stdout)
    assert later["asks"] == 0 and later["asks_per_hour"] == []


def _mcp_elicited(env):
    import subprocess
    import sys
    code = ("import os, time; from envgit.paths import find_project; from envgit.daemon.client import connect\n"
            "c = connect(find_project())\n"
            "b = c.request({'op': 'begin', 'argv': ['mcp', 'execute'], 'cwd': os.getcwd(), 'env': {}, "
            "'pid': os.getpid(), 'record_only': True, 'session': 'claude-1-abcd'})\n"
            "c.request({'op': 'event', 'step': b['step'], 'kind': 'note', 'body': {'type': 'mcp-ask', "
            "'server': 'corpus', 'tool': 'create_issue', 'rule': 'mcp.rules[0]', 'question': 'allow?', "
            "'answer': 'allow', 'how': 'MCP elicitation: accept, allow=True', 'channel': 'elicitation', "
            "'who': 'agent-client', 'at': time.time()}})\n"
            "c.request({'op': 'end', 'step': b['step'], 'exit_code': 0, 'signal': None, 'duration_ms': 1})\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=env.root, env=env.env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
