"""`envgit export --format ocsf`: real steps (`envgit run`, bwrap, the gate, an ask answered
from another terminal) exported as OCSF events; every line has OCSF's required base fields and
its values are the journal's (compared with `envgit export`'s own records)."""

import json
import shlex
from datetime import datetime
from importlib import resources

import pytest

from test_grants import CURL, Person, grants_world  # noqa: F401  (the fixture `world`)

REQUIRED = ("class_uid", "category_uid", "activity_id", "type_uid", "time", "severity_id", "metadata")
ACTIVITIES = {1007: {1, 2}, 4002: {1, 2, 3, 4, 5, 6, 7, 8, 9, 99}, 6004: {1, 2}}


def ocsf_schema():
    """OCSF 1.7.0's own schema (the dictionary of every attribute with its type, and the
    classes), as the pydantic-ocsf package ships it (the test extra)."""
    try:
        return json.loads(resources.files("ocsf").joinpath("schemas/v1_7_0.json").read_text())
    except (ModuleNotFoundError, FileNotFoundError):
        pytest.fail("pydantic-ocsf is not installed (pip install -e .[test])")


CLASSES = {1007: "process_activity", 4002: "http_activity", 6004: "web_resource_access_activity"}
INTS = {"integer_t", "long_t", "timestamp_t", "port_t"}


def check_against_schema(event, schema):
    """Every attribute envgit emits is one OCSF defines, with OCSF's type; the activity is one
    of the class's; the class's required attributes are there."""
    attrs, types = schema["dictionary"]["attributes"], schema["dictionary"]["types"]["attributes"]

    def base(t):
        while t in types and types[t].get("type") and types[t]["type"] != t:
            t = types[t]["type"]
        return t

    def check(key, value, where):
        assert key in attrs, f"{where}{key} is not an OCSF attribute"
        spec = attrs[key]
        if spec.get("is_array"):
            assert isinstance(value, list), f"{where}{key} must be an array"
            for v in value:
                check_one(key, spec, v, where)
        else:
            check_one(key, spec, value, where)

    def check_one(key, spec, value, where):
        t = base(spec["type"])
        if key == "unmapped":
            return
        if t in INTS:
            assert isinstance(value, int) and not isinstance(value, bool), f"{where}{key}={value!r}: {t}"
        elif t == "string_t":
            assert isinstance(value, str), f"{where}{key}={value!r}: {t}"
        elif t == "boolean_t":
            assert isinstance(value, bool), f"{where}{key}={value!r}: {t}"
        elif t == "float_t":
            assert isinstance(value, (int, float)), f"{where}{key}={value!r}: {t}"
        elif not t.endswith("_t"):                         # an object
            assert isinstance(value, dict), f"{where}{key}: an object"
            for k, v in value.items():
                check(k, v, f"{where}{key}.")

    for k, v in event.items():
        check(k, v, "")
    cls = schema["events"][CLASSES[event["class_uid"]]]
    assert str(event["activity_id"]) in cls["attributes"]["activity_id"]["enum"], event
    chain, name = [], CLASSES[event["class_uid"]]
    while name:
        chain.append(schema["events"][name]["attributes"])
        name = schema["events"][name].get("extends")
    for a in chain:
        for k, spec in a.items():
            if isinstance(spec, dict) and spec.get("requirement") == "required":
                assert k in event, f"required {k} missing: {event}"


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

    schema = ocsf_schema()
    for e in events:                                   # OCSF's required base fields, every line
        check_against_schema(e, schema)
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
        for e, q in zip(http, rec["requests"], strict=True):
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
        for e, a in zip(grants, rec["approvals"], strict=True):
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
