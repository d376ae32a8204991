"""What an `ask` is a question about, and so what one answer (or a remembered grant) covers:
for a git push the repository and its exact ref updates (old -> new, hence create/delete/force)
and push options; for GraphQL every operation (type, name, top-level fields); for any other
request the methods (acts.methods), host, port, paths (acts.paths) and query. A different
effect is asked again. Pure: no I/O."""

import hashlib
from dataclasses import dataclass

from . import acts, graphql, receivepack
from .hostnames import norm_host
from .netrequest import Decision, Request


@dataclass(frozen=True)
class Effect:
    key: tuple                               # equal keys: the same effect (within one step)
    shown: dict                              # what the person is asked about
    doubt: str = ""                          # why the effect cannot be known: deny, do not ask


def approval_effect(d: Decision, req: Request) -> Effect:
    """What an `ask` about `req` (decided `d`) is a question about, and so what one answer
    covers (see the module doc). With doubt, nobody can be asked about it."""
    where = (norm_host(req.host), req.port)
    if d.body_rule == "git-ref-updates":
        if req.body_error:
            return Effect((), {}, f"the push cannot be read ({req.body_error})")
        push = receivepack.read_push(req.body or b"")
        if push.doubt:
            return Effect((), {}, push.doubt)
        repo = req.path.rsplit("/", 1)[0] or "/"
        return Effect(("git push", *where, req.path, push.updates, push.options),
                      {"repository": repo, "refs": [u.to_json() for u in push.updates],
                       "options": list(push.options)})
    if d.body_rule.startswith("graphql-"):
        if req.body_error:
            return Effect((), {}, f"the GraphQL request cannot be read ({req.body_error})")
        r = graphql.read(req.body, req.headers.get("content-type", ""), req.query, req.body_complete)
        if r.doubt:
            return Effect((), {}, f"its GraphQL operations cannot be read: {r.doubt}")
        return Effect(("graphql", *where, req.path, r.operations),
                      {"operations": [o.to_json() for o in r.operations]})
    overrides = sorted(acts.methods(req) - {req.method.upper()})
    rewrites = acts.paths(req)[1:]
    shown = {"method_override": overrides} if overrides else {}
    if rewrites:
        shown["rewrite_paths"] = rewrites
    return Effect(("request", req.method.upper(), *overrides, *where, req.path, req.query,
                   "rewrite_paths", *rewrites), shown)


def query_digest(query: str) -> str | None:
    """What a grant keeps of a query: its sha256 (the values may be tokens), None when empty."""
    return hashlib.sha256(query.encode("utf-8", "surrogateescape")).hexdigest() if query else None
