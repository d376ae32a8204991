"""Which requests a credential may go on, pure: the decision the gate's credential addons
(proxy/credentials.py, proxy/echoguard.py) act on. No I/O.

A credential (`credentials.NAME` of the policy: `hosts`, optional `methods` and `paths`)
covers a request only over TLS (the real value never crosses the network in the clear), to
one of its hosts, within its methods (every method a server may act on: policy/acts.py, the
one reader the request rules use too) and its paths (every path a server may route the
request to, on every reading a server may give it: policy/urlpath.py, as l7 does, compared
exactly, case too). A placeholder, or a real value the gate read, on a request its credential
does not cover is denied with rule `credential-misuse`, before and apart from every ask: no
approval widens a credential.
"""

import re

from . import acts, hostnames, urlpath
from .netrequest import Decision, Request
from .netrules import url_glob

RULE = "credential-misuse"
ECHO = "credential-echo"    # the kind of a response withheld for a real value it carried


def path_glob(pattern: str) -> re.Pattern:
    """A credential's `paths` entry: the request rules' URL glob, but exact about case. A
    narrowing allows, so it must not admit another spelling a case-sensitive server (S3 keys,
    git hosts' repositories, Artifactory) reads as another resource."""
    return re.compile(url_glob(pattern).pattern)


def on_its_hosts(cred: dict, host: str, port: int) -> bool:
    """Is host:port one of the credential's hosts (any port its entry names)?"""
    return any(hostnames.entry_matches(e, host, port) for e in cred["hosts"])


def covers(cred: dict, scheme: str, host: str, port: int, methods: frozenset | set, path: str) -> bool:
    """Is this request one the credential may go on? Only over TLS, to one of its hosts, and
    within its methods (`methods`: every method the server may read) and paths (`path` on
    every reading a server may give it, compared exactly: path_glob)."""
    if scheme != "https" or not on_its_hosts(cred, host, port):
        return False
    allowed = {m.upper() for m in cred.get("methods") or ["*"]}
    if "*" not in allowed and not methods <= allowed:
        return False
    if cred.get("paths"):
        globs = [path_glob(p) for p in cred["paths"]]
        readings = urlpath.readings(path.partition("?")[0])
        return not readings.doubt and all(any(g.fullmatch(s) for g in globs)
                                          for s in readings.spellings)
    return True


def uncovered(credentials: dict, names, req: Request) -> str | None:
    """The first of `names` whose credential does not cover `req` (a name no longer in the
    policy covers nothing), or None. Judged on every method and path a server may act on
    (policy/acts.py): a credential narrowed to methods or paths goes on none other."""
    methods, paths = acts.methods(req), acts.paths(req)
    for name in names:
        cred = credentials.get(name)
        if cred is None or not all(covers(cred, req.scheme, req.host, req.port, methods, p)
                                   for p in paths):
            return name
    return None


def misuse(name: str, what: str, host: str, port: int, method: str) -> Decision:
    """The denial of a request that carried the `what` ("placeholder", "real value") of
    credential `name` where it does not cover."""
    return Decision(
        "deny", RULE, f"the {what} of credential '{name}' was sent to "
        f"{hostnames.norm_host(host)}:{port} ({method}), which the credential "
        "does not cover (its hosts, methods and paths, over https only); nothing was "
        "swapped or sent",
        hint=f"credentials.{name}.hosts (and methods/paths) in envgit.yaml say where it may go")
