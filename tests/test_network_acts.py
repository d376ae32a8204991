"""policy/acts.py, the one reader of what a server acts on (methods and paths), and the
decisions built on it: pure, no network. The end-to-end proofs are in tests/adversarial/
(test_gate_method_override.py, test_grants_forgery.py, test_credential_methods.py,
test_credential_paths.py), which drive real curl through the gate."""

import pytest

from envgit.policy import acts
from envgit.policy.approval import approval_effect
from envgit.policy.network import decide_request
from test_network_decide import pol, req

FORM = {"content-type": "application/x-www-form-urlencoded"}


@pytest.mark.parametrize("where,body,headers", [
    ("?_method=DELETE", None, {}),
    ("?%5Fmethod=delete", None, {}),
    ("", b"a=1&%5Fmethod=DELETE", FORM),
    ("", b".method=DELETE", FORM),
    ("", b"+method=DELETE", FORM),
    ("", b"%20method=DELETE", FORM),
    ("", b"[method=DELETE", FORM),
    ("", b"_METHOD=DELETE", FORM),
    ("", b"_method=DELETE", {}),                         # no type: Rack reads a POST as a form
    ("", b'{"_method": "DELETE"}', {"content-type": "application/json"}),
    ("", b'--b\r\nContent-Disposition: form-data; name=".method"\r\n\r\nDELETE\r\n--b--\r\n',
     {"content-type": "multipart/form-data; boundary=b"}),
    ("", None, {"X-HTTP-Method": "DELETE"}),
    ("", None, {"x-method-override": "GET, DELETE"}),
])
def test_every_spelling_of_a_method_override_is_read(where, body, headers):
    r = req("POST", "https://api.example.com/items/1" + where, body,
            headers={k.lower(): v for k, v in headers.items()})
    assert "DELETE" in acts.methods(r)


def test_a_post_body_not_read_whole_has_an_unknown_method():
    big = req("POST", "https://api.example.com/items/1", b"a" * 100, headers=FORM, body_complete=False)
    assert acts.UNKNOWN in acts.methods(big)
    # a PUT's body is not overridden by these frameworks; an octet stream has no fields
    assert acts.UNKNOWN not in acts.methods(req("PUT", "https://api.example.com/x", b"a", headers=FORM,
                                                body_complete=False))
    assert acts.UNKNOWN not in acts.methods(req("POST", "https://api.example.com/x", b"a", body_complete=False,
                                                headers={"content-type": "application/octet-stream"}))


def test_l7_and_irreversible_rules_judge_every_method():
    p = pol(allow=["api.example.com"], irreversible=[],
            l7={"api.example.com": {"methods": ["GET", "POST"]}})
    assert decide_request(p, req("POST", "https://api.example.com/items/1", b"a=1", headers=FORM)).action == "allow"
    d = decide_request(p, req("POST", "https://api.example.com/items/1", b"%5Fmethod=DELETE", headers=FORM))
    assert d.action == "deny" and "DELETE" in d.reason
    assert decide_request(p, req("POST", "https://api.example.com/items/1", b"a", headers=FORM,
                                 body_complete=False)).action == "deny"
    rules = [{"net": {"host": "api.example.com", "method": "DELETE", "path": "/items/**"}, "action": "deny"}]
    p = pol(allow=["api.example.com"], irreversible=rules)
    assert decide_request(p, req("POST", "https://api.example.com/items/1", b"a=1", headers=FORM)).action == "allow"
    for body, complete in ((b".method=DELETE", True), (b"a", False)):
        d = decide_request(p, req("POST", "https://api.example.com/items/1", body, headers=FORM,
                                  body_complete=complete))
        assert d.action == "deny" and d.irreversible, body


def test_rewrite_headers_add_their_paths():
    p = pol(allow=["api.example.com"], irreversible=[], l7={"api.example.com": {"paths": ["/v1/**"]}})
    assert decide_request(p, req("GET", "https://api.example.com/v1/x")).action == "allow"
    for h in ("x-original-url", "x-rewrite-url"):
        for v in ("/admin", "https://api.example.com/admin?x=1", "/v1/../admin"):
            got = decide_request(p, req("GET", "https://api.example.com/v1/x", headers={h: v}))
            assert got.action == "deny", (h, v)
    r = req("GET", "https://api.example.com/v1/x", headers={"x-original-url": "https://h/admin?q"})
    assert acts.paths(r) == ["/v1/x", "/admin"]


def test_an_answer_covers_only_the_methods_and_paths_it_was_asked_about():
    rules = [{"net": {"host": "api.example.com", "method": "*", "path": "/api/**"}, "action": "ask"}]
    p = pol(allow=["api.example.com"], irreversible=rules)
    plain = req("POST", "https://api.example.com/api/one", b"a=1", headers=FORM)
    d = decide_request(p, plain)
    keys = {approval_effect(d, r).key for r in (
        plain,
        req("POST", "https://api.example.com/api/one", b"%5Fmethod=DELETE", headers=FORM),
        req("POST", "https://api.example.com/api/one", b"a=1", headers={**FORM, "x-rewrite-url": "/api/two"}))}
    assert len(keys) == 3
    shown = approval_effect(d, req("POST", "https://api.example.com/api/one", b".method=DELETE",
                                   headers={**FORM, "x-original-url": "/api/two"})).shown
    assert shown == {"method_override": ["DELETE"], "rewrite_paths": ["/api/two"]}


def test_what_is_kept_on_a_request_is_never_another_bodys():
    """Request.memo keeps what the body predicates and the `_method` search found, for the
    judge and the record's facts; a request made from it with another body starts afresh."""
    import dataclasses

    from envgit.policy.netrules import BODY_PREDICATES
    post = req("POST", "https://api.github.com/graphql", body=b'{"query": "mutation { a }"}',
               headers={"content-type": "application/json"})
    assert BODY_PREDICATES["graphql-mutation"](post) and acts.methods(post) == {"POST"}
    other = dataclasses.replace(post, body=b'{"query": "query { a }", "_method": "DELETE"}')
    assert not BODY_PREDICATES["graphql-mutation"](other)
    assert acts.methods(other) == {"POST", "DELETE"}
    assert BODY_PREDICATES["graphql-mutation"](post) and acts.methods(post) == {"POST"}
