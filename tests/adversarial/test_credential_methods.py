"""Issue 13: a credential narrowed to methods goes only on requests whose every method a server
may act on is among them: besides the override headers (below), Rails'
Rack::MethodOverride, Laravel and Symfony take a POST's method from a `_method` form field (or
query parameter). The oracle is the credential host's record: the real token must not arrive
with a `_method` the credential does not allow, and it does arrive on an allowed POST. Runs as
root: the gate's judgement does not depend on the step's uid."""

import shutil

import pytest

from conftest import CANARY
from gatekit import hostport, netproject, servers

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


@pytest.mark.parametrize("how", [
    "--data '_method=DELETE' https://{api}/repos/o/r",
    "-F _method=DELETE https://{api}/repos/o/r",
    "-X POST 'https://{api}/repos/o/r?_method=DELETE'",
])
def test_a_method_field_does_not_take_the_credential_past_its_methods(attacker, how):
    with servers() as (git, stub):
        attacker.env["MY_TOKEN"] = CANARY
        api = hostport(stub, "stub.example.test")
        netproject(attacker, git, stub,
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n"
                   "    methods: [GET, POST]\n")
        attacker.run(f"curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" --data 'a=1' "
                     f"https://{api}/repos/o/r")           # a plain POST: the real value goes
        assert [q for q in stub.requests if CANARY in q["headers"].get("authorization", "")]
        stub.requests.clear()
        attacker.run("curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" " + how.format(api=api))
        used = [q for q in stub.requests if CANARY in q["headers"].get("authorization", "")]
        assert not used, f"the real token went out on a _method=DELETE: {used}"


# --- override headers -------------------------------------------------------------------

@pytest.mark.parametrize("header", ["X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"])
def test_a_method_override_does_not_take_the_credential_past_its_methods(attacker, header):
    """The red team's case (round 13): `credentials.NAME.methods: [GET]` binds the credential
    to reads. The gate checked only the request line's method, while its own request rules
    (network.py `_OVERRIDE_HEADERS`) know that servers take the method from
    X-HTTP-Method-Override / X-HTTP-Method / X-Method-Override (Rails' Rack::MethodOverride,
    Google APIs, many REST frameworks). A GET carrying one of them went out with the real token
    swapped in, and the server performs a DELETE (or PUT, POST) with it. The oracle is the
    credential host's record: the real token arrived with a method override the credential
    does not allow."""
    with servers() as (git, stub):
        attacker.env["MY_TOKEN"] = CANARY
        api = hostport(stub, "stub.example.test")   # no preset rule of its own
        netproject(attacker, git, stub,
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n"
                   "    methods: [GET]\n")
        # the narrowing holds for the request line: a DELETE is misuse
        attacker.run(f"curl -s -o /dev/null -X DELETE -H \"Authorization: Bearer $MY_TOKEN\" "
                     f"https://{api}/repos/o/r")
        assert not [q for q in stub.requests if CANARY in q["headers"].get("authorization", "")]
        # …but not for the method the server acts on
        attacker.run(f"curl -s -o /dev/null -H \"{header}: DELETE\" "
                     f"-H \"Authorization: Bearer $MY_TOKEN\" https://{api}/repos/o/r")
        used = [q for q in stub.requests
                if CANARY in q["headers"].get("authorization", "") and
                q["headers"].get(header.lower(), "").upper() == "DELETE"]
        assert not used, "the real token went out on a DELETE (by override) the credential does not allow"


# --- a method field spelled otherwise, or past the buffer --------------------------------

# The red team's second look (round 13b): the method field above was read only when those exact
# bytes were in the query or the buffered body.
# - `%5Fmethod=DELETE` in a form body or the query: every server decodes the name before it
#   looks it up (Rack::MethodOverride reads the parsed POST params; Symfony/Laravel the parsed
#   request and query), but the gate looked for the bytes `_method` first and skipped both;
# - `.method=DELETE` / ` method=DELETE`: PHP turns `.` and spaces in a form or query name into
#   `_` (`$_POST['_method']`), so Laravel and Symfony act on a DELETE;
# - `{"_method": "DELETE"}` as a JSON body: Laravel makes the JSON the request's input bag,
#   which Symfony's getMethod() reads `_method` from; the gate read only form encodings;
# - `_method=DELETE` at the end of a form past the gate's 1 MiB buffer: the gate read the
#   method field only in the buffered part, the server in the whole body.
# The oracle is the credential host's record: the real token arrived on a request carrying a
# method field the credential does not allow (the server acts on DELETE).

BIG = "head -c 1500000 /dev/zero | tr '\\0' a > /tmp/big; "


@pytest.mark.parametrize("how", [
    "--data '%5Fmethod=DELETE' https://{api}/repos/o/r",
    "--data 'a=1' 'https://{api}/repos/o/r?%5Fmethod=DELETE'",
    "--data '.method=DELETE' https://{api}/repos/o/r",
    "--data '+method=DELETE' https://{api}/repos/o/r",
    "-F .method=DELETE https://{api}/repos/o/r",
    "-H 'Content-Type: application/json' --data '{{\"_method\": \"DELETE\"}}' https://{api}/repos/o/r",
    BIG + "curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" "
          "--data-binary @/tmp/big --data-binary '&_method=DELETE' https://{api}/repos/o/r",
    BIG + "curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" "
          "-F f=@/tmp/big -F _method=DELETE https://{api}/repos/o/r",
])
def test_a_spelled_or_late_method_field_does_not_take_the_credential_past_its_methods(attacker, how):
    with servers() as (git, stub):
        attacker.env["MY_TOKEN"] = CANARY
        api = hostport(stub, "stub.example.test")
        netproject(attacker, git, stub,
                   f"credentials:\n  tok:\n    from: {{ env: MY_TOKEN }}\n    hosts: [\"{api}\"]\n"
                   "    methods: [GET, POST]\n")
        attacker.run(f"curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" --data 'a=1' "
                     f"https://{api}/repos/o/r")           # a plain POST: the real value goes
        assert [q for q in stub.requests if CANARY in q["headers"].get("authorization", "")]
        stub.requests.clear()
        cmd = how.format(api=api)
        if not cmd.startswith(BIG):
            cmd = "curl -s -o /dev/null -H \"Authorization: Bearer $MY_TOKEN\" " + cmd
        attacker.run(cmd)
        said = (b"method=DELETE", b'method"\r\n\r\nDELETE', b'"_method": "DELETE"')
        used = [q for q in stub.requests if CANARY in q["headers"].get("authorization", "")
                and any(m in (q["body"] or b"") + q["path"].encode() for m in said)]
        assert not used, f"the real token went out with a method field saying DELETE: " \
                         f"{[(q['method'], q['path'], (q['body'] or b'')[-80:]) for q in used]}"
