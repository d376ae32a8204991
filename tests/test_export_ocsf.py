"""`envgit export --format ocsf`: real steps (`envgit run`, bwrap, the gate, an ask answered
from another terminal) exported as OCSF events; every line has OCSF's required base fields and
its values are the journal's (compared with `envgit export`'s own records)."""

import json
import shlex
from datetime import datetime

from test_grants import CURL, Person, world  # noqa: F401  (world: the fixture)

REQUIRED = ("class_uid", "category_uid", "activity_id", "type_uid", "time", "severity_id", "metadata")
ACTIVITIES = {1007: {1, 2}, 4002: {1, 2, 3, 4, 5, 6, 7, 8, 9, 99}, 6004: {1, 2}}


def ms(iso):
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def test_ocsf_lines_have_the_base_fields_and_the_journals_values(world):
    w, env = world, world.env
    with Person(env, lambda q: ["approve"]):
        r = env.run(f"{CURL} {w.url(path='/plain')}; {CURL} -X POST --data-binary x {w.url()}; "
                    f"{CURL} https://unlisted.example.test/; echo hi > f.txt")
    assert r.stdout.split()[:2] == ["200", "200"], r.stdout + r.stderr
    env.run("exit 3")
    out = env.envgit("export", "--format", "ocsf", check=True).stdout
    assert out.isascii()
    events = [json.loads(line) for line in out.splitlines()]
    recs = [json.loads(line) for line in env.envgit("export", check=True).stdout.splitlines()]
    assert len(recs) == 2 and recs[0]["requests"] and recs[0]["approvals"]

    for e in events:                                   # OCSF's required base fields, every line
        for k in REQUIRED:
            assert k in e, (k, e)
        assert e["activity_id"] in ACTIVITIES[e["class_uid"]], e
        assert e["type_uid"] == e["class_uid"] * 100 + e["activity_id"]
        assert e["category_uid"] == e["class_uid"] // 1000
        assert isinstance(e["time"], int) and e["time"] > 1_600_000_000_000
        assert e["severity_id"] in range(0, 7)
        assert e["metadata"]["product"]["name"] == "envgit" and e["metadata"]["version"] == "1.7.0"
        assert e["metadata"]["product"]["version"]

    # the values are the journal's: each record's events, in order, by correlation uid
    assert len(events) == sum(2 + len(r["requests"]) + len(r["approvals"]) for r in recs)
    for rec in recs:
        mine = [e for e in events if e["metadata"]["correlation_uid"] == f"{rec['session']}/{rec['step']}"]
        launch, *middle, end = mine
        assert (launch["class_uid"], launch["activity_id"]) == (1007, 1)
        assert (end["class_uid"], end["activity_id"]) == (1007, 2)
        assert launch["time"] == ms(rec["started_at"]) and end["time"] == ms(rec["ended_at"])
        assert launch["process"]["cmd_line"] == shlex.join(rec["argv"])
        assert launch["actor"]["user"]["name"] == rec["user"] == end["process"]["user"]["name"]
        assert end["exit_code"] == rec["exit_code"]
        assert end["status_id"] == (1 if rec["exit_code"] == 0 else 2)
        assert launch["unmapped"]["envgit"]["policy_sha256"] == rec["policy_sha256"]
        http = [e for e in middle if e["class_uid"] == 4002]
        assert len(http) == len(rec["requests"])
        for e, q in zip(http, rec["requests"]):
            assert e["http_request"]["http_method"] == q["method"]
            assert e["http_request"]["url"]["hostname"] == q["host"] == e["dst_endpoint"]["hostname"]
            assert e["http_request"]["url"]["port"] == q["port"]
            assert e["http_request"]["url"]["path"] == q["path"]
            assert e["time"] == ms(q["started_at"])
            out = q["decision"] == "allow" or q["decision"] == "ask" and q["answer"].startswith("allow")
            assert e["action_id"] == (1 if out else 2)
            assert e["severity_id"] == (3 if out and q["irreversible"] else 1 if out else 2)
            assert e.get("http_response", {}).get("code") == q["status"]
            assert e["unmapped"]["envgit"]["rule"] == q["rule"]
        grants = [e for e in middle if e["class_uid"] == 6004]
        assert len(grants) == len(rec["approvals"])
        for e, a in zip(grants, rec["approvals"]):
            assert e["activity_id"] == (1 if a["answer"].startswith("allow") else 2)
            assert e["actor"]["user"]["name"] == a["who"]
            assert e["time"] == ms(a["at"])
            assert e["unmapped"]["envgit"]["channel"] == a["channel"]

    first = [e for e in events if e["metadata"]["correlation_uid"].endswith("/1")]
    methods = [(e["http_request"]["http_method"], e["action_id"]) for e in first if e["class_uid"] == 4002]
    assert ("POST", 1) in methods, methods               # asked, approved, let out
    assert ("CONNECT", 2) in methods, methods            # the unlisted host: denied
    assert [e["activity_id"] for e in first if e["class_uid"] == 6004] == [1]
    last = events[-1]
    assert (last["class_uid"], last["activity_id"], last["exit_code"], last["status_id"]) == (1007, 2, 3, 2)
