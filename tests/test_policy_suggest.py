"""`envgit policy suggest`, `--apply`, `envgit policy replay --against REV` and the counts of
`envgit stats`: a session of real steps (real bwrap, the daemon's gate) that installs with the
real pip through pypi.org (a local HTTPS stand-in, as tests/test_daily_network.py serves it),
reads a REST API and once POSTs to it (a plain-HTTP server on 127.0.0.1), fetches from a git
remote and tries a push (git http-backend over HTTPS). Names reach the local servers through
ENVGIT_RESOLVE; the policy and the records say the real names."""

import json
import shutil
import subprocess
import threading
from http.server import ThreadingHTTPServer

import pytest

from conftest import BIN, Env, make_home
from gitserver import GitServer, HTTPSServer
from kit.registries import pypi_app, wheel
from modelserver import clone_for_push
from test_daily_network import PIP
from test_policy_replay import _Api
from uikit import UI

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

POLICY = """\
version: 1
# the person's own words: kept by every suggestion
network:
  allow: ["{git}"]    # the forge
irreversible:
  - preset: default
  - name: api-write         # the API's writes stay refused
    net: {{ host: "api.example.test", method: POST }}
    action: deny
"""


def session_steps(api_port):
    api = f"http://api.example.test:{api_port}"
    return [
        (f"PIP_CONFIG_FILE=/dev/null {PIP} -m pip install -q --disable-pip-version-check --no-input "
         "--retries 0 --timeout 10 --target deps --index-url https://pypi.org/simple/ envgit-tiny"),
        f"curl -sS -f {api}/items; curl -sS -f {api}/items/1",
        f"curl -sS -f -X POST -d name=x {api}/items",
        "git fetch -q origin && git commit -q --allow-empty -m more && git push -q origin HEAD:main",
    ]


def run_session(env, api_port) -> list[int]:
    return [env.run(s).returncode for s in session_steps(api_port)]


def steps_of(env) -> list[dict]:
    return json.loads(env.envgit("log", "--json", check=True).stdout)


def git(env, *argv):
    return subprocess.run(["git", *argv], cwd=env.root, capture_output=True, text=True, timeout=60, check=True)


@pytest.fixture
def world(tmp_path):
    api = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    api.hits = []
    threading.Thread(target=api.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    with GitServer(root=tmp_path / "git") as remote, \
            HTTPSServer(pypi_app(wheel()), ("pypi.org", "files.pythonhosted.org"), root=tmp_path / "pypi",
                        ca=remote.ca) as pypi:
        resolve = ",".join([remote.resolve, "api.example.test=127.0.0.1",
                            *(f"{n}=127.0.0.1:{pypi.port}" for n in pypi.names)])
        home = make_home(tmp_path)
        env = Env(home, home / "app", {"ENVGIT_RESOLVE": resolve, "ENVGIT_UPSTREAM_CA": str(remote.ca.cert_path)})
        clone_for_push(env, remote)
        env.write_policy(POLICY.format(git=remote.url.split("/")[2]))
        (env.root / ".gitignore").write_text(".envgit/\ndeps/\n")
        git(env, "add", "envgit.yaml", ".gitignore")
        git(env, "commit", "-qm", "the policy")
        try:
            yield env, api, remote
        finally:
            env.stop()
            api.shutdown()
            api.server_close()


def test_suggest_apply_and_the_same_steps_again(world):
    env, api, remote = world
    port = api.server_address[1]
    before = remote.refs()
    assert all(code != 0 for code in run_session(env, port))     # each refused something
    assert api.hits == [] and remote.refs() == before

    # the suggestion: the preset for pypi's hosts, a GET-only rule for the API read with GET
    r = env.envgit("policy", "suggest", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    from test_cli_conventions import documented_keys  # the keys docs/JSON.md lists
    keys = documented_keys()
    assert set(doc) == keys["policy.suggest"] and set(doc["replay"]) == keys["policy.replay.summary"]
    assert all(set(ln) == keys["policy.suggest.line"] for ln in doc["lines"])
    assert all(set(n) == keys["policy.suggest.not_suggested"] for n in doc["not_suggested"])
    added = {ln["text"]: ln for ln in doc["lines"]}
    rule = f'api.example.test:{port}: {{ methods: [GET], paths: ["/items", "/items/**"] }}'
    assert set(added) == {"preset:pypi", f"api.example.test:{port}", rule}, doc["lines"]
    assert added["preset:pypi"]["steps"] == [1] and added[rule]["steps"] == [2], doc["lines"]
    assert not any("pypi.org" in t or "pythonhosted" in t for t in added), added
    text = (env.root / "envgit.yaml").read_text()
    for ln in doc["lines"]:         # each line is where the diff puts it
        assert ln["line"] > 0 and ln["file"] == "envgit.yaml"
    # the push and the API's POST are never suggested: each listed with its step
    refused = {(n["rule"], tuple(n["steps"])) for n in doc["not_suggested"]}
    assert refused == {("preset:default/git-push", (4,)), ("api-write", (3,))}, doc["not_suggested"]
    assert all(n["why"].startswith("irreversible: ") for n in doc["not_suggested"])
    assert doc["replay"]["irreversible_newly_allowed"] == 0 and doc["saved"]["asks"] == 0
    assert doc["saved"]["denials"] >= 3 and doc["applied"] is False, doc
    assert "+  allow: [" in doc["diff"] and '+    "api.example.test' in doc["diff"], doc["diff"]
    shown = env.envgit("policy", "suggest")
    assert shown.returncode == 0 and f"envgit.yaml:{added['preset:pypi']['line']}: + preset:pypi" in shown.stdout
    assert "not suggested: irreversible: git push" in shown.stdout and "step(s) 4:" in shown.stdout, shown.stdout
    assert (env.root / "envgit.yaml").read_text() == text          # without --apply nothing is written

    # the counts: denials per hour, and what the suggestion would have saved of them
    s = json.loads(env.envgit("stats", "--json", check=True).stdout)
    assert set(s) == keys["stats"], set(s) ^ keys["stats"]
    assert s["denials"] == sum(h["denials"] for h in s["denials_per_hour"]) >= 5, s
    assert s["suggested"] == {"lines": 3, "asks_saved": 0, "denials_saved": doc["saved"]["denials"]}, s
    assert "denials per hour:" in env.envgit("stats", check=True).stdout
    with UI(env) as ui:             # the page's timeline says the same
        status, _, body = ui.get("/")
        assert status == 200 and f"{s['denials']} requests denied" in body, body
        assert f"would have saved 0 of the asks and {doc['saved']['denials']} of the denials" in body, body

    # --apply: the file keeps the person's comments and layout, lines only added
    r = env.envgit("policy", "suggest", "--apply")
    assert r.returncode == 0 and "wrote envgit.yaml" in r.stdout, r.stdout + r.stderr
    new = (env.root / "envgit.yaml").read_text()
    old_lines, new_lines = text.splitlines(), new.splitlines()
    forge = remote.url.split("/")[2]
    assert [ln for ln in old_lines if ln not in new_lines] == [f'  allow: ["{forge}"]    # the forge']
    assert "# the person's own words: kept by every suggestion" in new and "# the forge" in new
    assert "  - name: api-write         # the API's writes stay refused" in new
    assert env.envgit("policy", "check").returncode == 0

    # replay --against the committed policy: the applied change newly allows nothing irreversible
    r = env.envgit("policy", "replay", "--against", "HEAD", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(r.stdout)
    assert d["against"] == "HEAD" and d["summary"]["newly_allowed"] >= 3, d
    assert d["summary"]["irreversible_newly_allowed"] == 0, d
    # a hand-widened policy is caught, by --against and as a candidate file
    (env.root / "widened.yaml").write_text(new.replace("action: deny", "action: allow"))
    assert env.envgit("policy", "replay", "widened.yaml").returncode == 1
    (env.root / "envgit.yaml").write_text(new.replace("action: deny", "action: allow"))
    r = env.envgit("policy", "replay", "--against", "HEAD")
    assert r.returncode == 1 and "IRREVERSIBLE" in r.stdout and "against HEAD's envgit.yaml" in r.stdout, r.stdout
    (env.root / "envgit.yaml").write_text(new)
    # errors name the fix
    root = git(env, "rev-list", "--max-parents=0", "HEAD").stdout.strip()     # the clone's first commit
    for rev, said in (("no-such-rev", "no revision 'no-such-rev'"), (root, "has no envgit.yaml")):
        r = env.envgit("policy", "replay", "--against", rev)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = env.envgit("policy", "replay", "--against", "HEAD", env={"PATH": str(BIN)})    # no git on PATH
    assert r.returncode == 2 and "git is not installed" in r.stderr, r.stderr

    # the same steps under the applied policy: nothing asked, only the irreversible refused
    first = len(steps_of(env))
    codes = run_session(env, port)
    assert codes[0] == 0 and codes[1] == 0 and codes[2] != 0 and codes[3] != 0, codes
    again = steps_of(env)[first:]
    reqs = [q for st in again for q in st["requests"]]
    assert not any(q["decision"] == "ask" for q in reqs), reqs
    assert {q["rule"] for q in reqs if q["decision"] != "allow"} == {"api-write", "preset:default/git-push"}, reqs
    assert ("GET", "/items/1") in api.hits and ("POST", "/items") not in api.hits
    assert remote.refs() == before
    r = env.envgit("policy", "suggest", "--since", "1m", "--json")
    assert json.loads(r.stdout)["lines"] == [], r.stdout   # nothing more is needed


def test_a_request_learn_mode_let_through_is_suggested_as_it_would_have_been_decided(tmp_path):
    # pure: a learn-mode record keeps decision "allow" and carries what it would have been
    from envgit.policy import load_policy
    from envgit.policy.suggest import suggest
    (tmp_path / "envgit.yaml").write_text("version: 1\nnetwork:\n  allow: []\n")
    pol = load_policy(tmp_path / "envgit.yaml")
    rec = {"method": "GET", "scheme": "https", "host": "api.example.org", "port": 443, "path": "/v1/things?q=",
           "decision": "allow", "rule": "learn", "kind": "", "intercepted": True,
           "learn": {"decision": "deny", "rule": "network.allow", "kind": "", "reason": "not in network.allow"},
           "facts": {"body": {"git-ref-updates": False, "pypi-upload": False, "lfs-upload": False,
                              "graphql-mutation": False, "graphql-subscription": False}}}
    s = suggest(pol, (tmp_path / "envgit.yaml").read_text(), [(7, [rec])])
    assert [(ln.text, ln.steps) for ln in s.lines] == [
        ("api.example.org", [7]), ('api.example.org: { methods: [GET], paths: ["/v1/**"] }', [7])], s.lines
    assert s.text == ('version: 1\nnetwork:\n  allow: ["api.example.org"]\n  l7:\n'
                      '    "api.example.org": { methods: [GET], paths: ["/v1/**"] }\n')


@pytest.mark.parametrize("before, after", [
    # a block list with a comment on its item, a comment after it, and the section after
    ("version: 1\nnetwork:\n  allow:\n    - a.example.com  # mine\n  # more below\nirreversible: []\n",
     "version: 1\nnetwork:\n  allow:\n    - a.example.com  # mine\n    - \"preset:pypi\"\n  l7:\n"
     "    \"b.example.com\": { methods: [GET] }\n  # more below\nirreversible: []\n"),
    # a flow mapping stays one
    ("version: 1\nnetwork: {allow: [a.example.com]}\n",
     "version: 1\nnetwork: {allow: [a.example.com, \"preset:pypi\"], l7: {\"b.example.com\": { methods: [GET] }}}\n"),
    # no network section at all, and no newline at the end
    ("version: 1  # v", "version: 1  # v\nnetwork:\n  allow: [\"preset:pypi\"]\n  l7:\n"
     "    \"b.example.com\": { methods: [GET] }\n"),
    # `l7: {}` with a comment becomes a block under the key; `allow:` with nothing gets the list
    ("version: 1\nnetwork:\n  allow:\n  l7: {}   # rules\n", "version: 1\nnetwork:\n  allow: [\"preset:pypi\"]\n"
     "  l7:   # rules\n    \"b.example.com\": { methods: [GET] }\n"),
])
def test_the_edit_keeps_the_files_layout(before, after):
    from envgit.policy.yamledit import add_entry, append
    got = add_entry(append(before, ("network", "allow"), ["preset:pypi"]), ("network", "l7"),
                    "b.example.com", {"methods": ["GET"]})
    assert got == after


def test_a_preset_naming_a_denied_host_is_not_suggested_but_the_host_is(tmp_path):
    # preset:npm names nodejs.org, which this file denies: a file allowing the preset would not
    # load, so the host the step needed is suggested by itself
    from envgit.policy import load_policy
    from envgit.policy.suggest import suggest
    text = 'version: 1\nnetwork:\n  allow: []\n  deny: ["nodejs.org"]\n'
    (tmp_path / "envgit.yaml").write_text(text)
    refused = {"method": "CONNECT", "scheme": "https", "port": 443, "path": "", "decision": "deny",
               "rule": "network.allow", "intercepted": False}
    s = suggest(load_policy(tmp_path / "envgit.yaml"), text,
                [(1, [{**refused, "host": "registry.npmjs.org"}, {**refused, "host": "pypi.org"}])])
    assert [ln.text for ln in s.lines] == ["registry.npmjs.org", "preset:pypi"]
    (tmp_path / "envgit.yaml").write_text(s.text)
    assert load_policy(tmp_path / "envgit.yaml").network_allow[:2] == ["registry.npmjs.org", "pypi.org"]


def test_a_task_run_once_in_learn_mode_is_suggested_applied_and_runs_again_refused_only_the_irreversible(world):
    env, api, remote = world
    port = api.server_address[1]
    before = remote.refs()
    learned = [env.envgit("learn", "--", "sh", "-c", s).returncode for s in session_steps(port)]
    assert learned[0] == 0 and learned[1] == 0 and learned[2] != 0 and learned[3] != 0, learned
    reqs = [q for st in steps_of(env) for q in st["requests"]]
    # learn mode let the gaps through and kept the irreversible refused
    assert {q["rule"] for q in reqs if q["decision"] != "allow"} == {"api-write", "preset:default/git-push"}, reqs
    assert any(q.get("learn") for q in reqs) and remote.refs() == before

    doc = json.loads(env.envgit("policy", "suggest", "--json", check=True).stdout)
    rule = f'api.example.test:{port}: {{ methods: [GET], paths: ["/items", "/items/**"] }}'
    assert {ln["text"] for ln in doc["lines"]} == {"preset:pypi", f"api.example.test:{port}", rule}, doc["lines"]
    assert {n["rule"] for n in doc["not_suggested"]} == {"api-write", "preset:default/git-push"}, doc
    assert doc["replay"]["irreversible_newly_allowed"] == 0
    assert env.envgit("policy", "suggest", "--apply").returncode == 0

    first = len(steps_of(env))
    codes = run_session(env, port)
    assert codes[0] == 0 and codes[1] == 0 and codes[2] != 0 and codes[3] != 0, codes
    again = [q for st in steps_of(env)[first:] for q in st["requests"]]
    assert not any(q["decision"] == "ask" or q.get("learn") for q in again), again
    assert {q["rule"] for q in again if q["decision"] != "allow"} == {"api-write", "preset:default/git-push"}, again
    assert remote.refs() == before


def test_asks_of_an_irreversible_rule_are_not_suggested_and_say_how_they_were_answered(tmp_path):
    # pure: an ask answered by a grant twice and by a person's deny once; the rule stays as it is
    from envgit.policy import load_policy
    from envgit.policy.suggest import suggest
    text = ('version: 1\nnetwork:\n  allow: ["api.example.org"]\nirreversible:\n  - name: api-write\n'
            '    net: { host: "api.example.org", method: POST }\n    action: ask\n')
    (tmp_path / "envgit.yaml").write_text(text)
    asked = {"method": "POST", "scheme": "https", "host": "api.example.org", "port": 443, "path": "/items",
             "decision": "ask", "rule": "api-write", "kind": "api-write", "irreversible": True, "intercepted": True}
    s = suggest(load_policy(tmp_path / "envgit.yaml"), text, [
        (2, [{**asked, "answer": "allow", "answered_how": "grant"}]),
        (3, [{**asked, "answer": "allow", "answered_how": "grant"},
             {**asked, "answer": "deny", "answered_how": "cli"}])])
    assert s.lines == [] and s.text == text
    (n,) = s.not_suggested
    assert (n.why, n.rule, n.steps) == ("irreversible: api-write", "api-write", [2, 3])
    assert n.answers == {"allow": 2, "deny": 1, "by_grant": 2}


# --- a step chooses its method and path: suggest reads them as text, never as a pattern ------

LEARNED = {"scheme": "https", "host": "api.example.org", "port": 443, "intercepted": True,
           "decision": "allow", "rule": "learn",
           "learn": {"decision": "deny", "rule": "network.allow", "kind": "", "reason": "not in network.allow"}}


def _suggest(tmp_path, text, records):
    from envgit.policy import load_policy
    from envgit.policy.suggest import suggest
    (tmp_path / "envgit.yaml").write_text(text)
    s = suggest(load_policy(tmp_path / "envgit.yaml"), text, [(1, records)])
    (tmp_path / "envgit.yaml").write_text(s.text)
    load_policy(tmp_path / "envgit.yaml")          # what it suggests loads
    return s


def _refused(s) -> dict:
    from envgit.policy.suggest import shown
    return {shown(r): n.why.split(" (")[0].split(":")[0] for n in s.not_suggested for _, r in n.needs}


def test_a_recorded_method_or_path_is_never_read_as_a_pattern_for_a_new_host(tmp_path):
    s = _suggest(tmp_path, "version: 1\nnetwork:\n  allow: []\n", [
        {**LEARNED, "method": "GET", "path": "/items/1"}, {**LEARNED, "method": "*", "path": "/x"},
        {**LEARNED, "method": "GET", "path": "/**"}, {**LEARNED, "method": "GET", "path": "/items/[a]"},
        {**LEARNED, "method": "GET", "path": "/" + "*" * 24 + "!"}])
    assert [ln.text for ln in s.lines] == [
        "api.example.org", 'api.example.org: { methods: [GET], paths: ["/items/**"] }'], s.lines
    assert _refused(s) == {"* api.example.org/x": "a method a rule cannot name",
                           "GET api.example.org/**": "a path holding a glob character",
                           "GET api.example.org/items/[a]": "a path holding a glob character",
                           "GET api.example.org/" + "*" * 24 + "!": "a path holding a glob character"}
    # only such requests: the host is not suggested at all
    s = _suggest(tmp_path, "version: 1\nnetwork:\n  allow: []\n", [
        {**LEARNED, "method": "*", "path": "/x"}, {**LEARNED, "method": "GET", "path": "/**"}])
    assert s.lines == [] and len(_refused(s)) == 2


def test_a_recorded_host_is_suggested_only_as_a_literal_name(tmp_path):
    s = _suggest(tmp_path, "version: 1\nnetwork:\n  allow: []\n", [
        {**LEARNED, "method": "CONNECT", "host": h, "path": ""}
        for h in ("*.com", "a b.example.org", "ok.example.org")])
    assert [ln.text for ln in s.lines] == ["ok.example.org"]
    assert set(_refused(s).values()) == {"a host that is not a literal name"} and len(_refused(s)) == 2


def test_a_recorded_method_or_path_is_never_read_as_a_pattern_for_an_l7_rule(tmp_path):
    text = ('version: 1\nnetwork:\n  allow: ["api.example.org"]\n  l7:\n'
            '    "api.example.org": { methods: [GET], paths: ["/public/**"] }\n')
    denied = {**LEARNED, "decision": "deny", "rule": "network.l7[api.example.org]", "learn": None}
    s = _suggest(tmp_path, text, [
        {**denied, "method": "*", "path": "/public/x"}, {**denied, "method": "GET", "path": "/**"},
        {**denied, "method": "HEAD", "path": "/public/y"}, {**denied, "method": "GET", "path": "/docs"},
        {**denied, "method": "POST", "path": "/public/z", "facts": {"methods": ["(other)"]}}])
    assert [ln.text for ln in s.lines] == ["api.example.org methods: HEAD", "api.example.org paths: /docs"]
    assert set(_refused(s).values()) == {"a method a rule cannot name", "a path holding a glob character"}
    assert len(_refused(s)) == 3


def test_a_method_yaml_reads_otherwise_is_not_suggested_and_a_word_is_quoted_unless_it_reads_back(tmp_path):
    import yaml

    from envgit.policy.yamledit import scalar
    words = ["GET", "NULL", "ON", "YES", "OFF", "TRUE", "Y", "NAN", "INF"]
    assert yaml.safe_load(scalar(words)) == words
    assert scalar(["GET", "NULL"]) == '[GET, "NULL"]'
    s = _suggest(tmp_path, "version: 1\nnetwork:\n  allow: []\n", [
        {**LEARNED, "method": "GET", "path": "/read"}, {**LEARNED, "method": "NULL", "path": "/odd"}])
    assert [ln.text for ln in s.lines][1] == 'api.example.org: { methods: [GET], paths: ["/read"] }'
    assert _refused(s) == {"NULL api.example.org/odd": "a method a rule cannot name"}


def test_a_new_hosts_l7_rule_is_made_when_an_l7_key_names_the_host_on_another_port(tmp_path):
    text = 'version: 1\nnetwork:\n  allow: []\n  l7:\n    "api.example.org:8443": { methods: [GET] }\n'
    s = _suggest(tmp_path, text, [{**LEARNED, "method": "GET", "path": "/read"}])
    assert [ln.text for ln in s.lines][1:] == ['api.example.org: { methods: [GET], paths: ["/read"] }']
    # a key for the host on every port already narrows it
    text = 'version: 1\nnetwork:\n  allow: []\n  l7:\n    "api.example.org": { methods: [GET] }\n'
    assert [ln.text for ln in _suggest(tmp_path, text, [{**LEARNED, "method": "GET", "path": "/read"}]).lines] \
        == ["api.example.org"]


def test_suggest_makes_at_most_max_globs_path_globs_for_a_host(tmp_path):
    from envgit.policy.suggest import MAX_GLOBS, MAX_SEGMENT
    s = _suggest(tmp_path, "version: 1\nnetwork:\n  allow: []\n", [
        *({**LEARNED, "method": "GET", "path": f"/p{i}/x"} for i in range(MAX_GLOBS + 10)),
        {**LEARNED, "method": "GET", "path": "/p0/y"},
        {**LEARNED, "method": "GET", "path": "/" + "a" * (MAX_SEGMENT + 1)}])
    assert len(s.lines[1].value["paths"]) == MAX_GLOBS
    assert sorted(set(_refused(s).values())) == [f"a path whose first segment is over {MAX_SEGMENT} characters",
                                                 f"over {MAX_GLOBS} path prefixes on one host"]
    assert len(_refused(s)) == 11


def test_a_request_is_shown_whatever_its_path_holds():
    from envgit.policy.suggest import shown
    assert shown({"method": "GET", "host": "h.example", "port": 443, "path": "//[?q=1"}) == "GET h.example//["
    assert shown({"method": "GET", "host": "h.example", "port": 8443, "path": "/a\udcff"}) == \
        "GET h.example:8443/a\\udcff"


def test_a_path_glob_of_a_run_of_stars_matches_a_long_path_at_once():
    import time

    from envgit.policy.netrules import url_glob
    t0 = time.monotonic()
    assert url_glob("/" + "*" * 24 + "!").fullmatch("/" + "a" * 4096) is None
    assert url_glob("/" + "*" * 25).fullmatch("/a/" * 2000)
    assert time.monotonic() - t0 < 0.5
    # a run is one wildcard: `**` (or longer) across segments, `*` within one
    assert url_glob("/a/***").fullmatch("/a/b/c") and not url_glob("/a/*").fullmatch("/a/b/c")
    assert url_glob("/a/*.json").fullmatch("/a/x.json") and url_glob("/a/?").fullmatch("/a/b")
