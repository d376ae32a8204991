"""`envgit trust`: review and approve what the project's policy makes the host read, run or
connect to (every credential with the hosts its value goes to, every MCP server;
hostcmd/trust.py keeps the approvals), list them, revoke them."""

import sys

from ..inert import inert
from ..paths import find_project
from . import EXIT_FAILED, Usage, command, json_flag, out


def add_parsers(sub, argparse):
    s = command(sub, "trust", help="approve what envgit.yaml makes this machine read, run or "
                "connect to (credentials and the hosts they go to, MCP servers); list or revoke "
                "approvals",
                example=["envgit trust          # show them, and approve after asking",
                         "envgit trust --yes    # approve what it shows without asking",
                         "envgit trust --list", "envgit trust --revoke"])
    g = s.add_mutually_exclusive_group()
    g.add_argument("--yes", action="store_true", help="approve every entry shown, "
                   "without asking (after reviewing them)")
    g.add_argument("--list", action="store_true", help="list this project's approvals")
    g.add_argument("--revoke", action="store_true", help="forget every approval of this project")
    json_flag(s)
    s.set_defaults(fn=cmd_trust)


def _policy(project):
    from ..policy import PolicyError, load_policy
    try:
        return load_policy(project.policy)
    except PolicyError as e:
        raise Usage(str(e)) from None


def _row(e: dict, trusted: bool) -> dict:
    return {"kind": e["kind"], "name": e["name"], "where": e["where"], "verb": e["verb"],
            "text": e["text"], "hosts": e["approves"].get("hosts"), "sent_to": e["sent_to"],
            "variables": e["variables"], "command": e["command"], "organisation": e["org"],
            "trusted": trusted, "digest": e["digest"]}


def _lines(r: dict) -> list[str]:
    state = "organisation" if r["organisation"] else "trusted" if r["trusted"] else "NOT TRUSTED"
    what = {"credential": "credential ", "signing": "signing "}.get(r["kind"], "mcp server ") + r["name"]
    out = [f"  [{state}] {r['where']}: {what}", f"      {r['verb']}: {r['text']}"]
    if r["variables"]:
        out.append("      with your environment's " + ", ".join(f"${{{v}}}" for v in r["variables"]))
    if r["kind"] == "credential":
        out.append(f"      {'its output' if r['command'] else 'its value'} is sent to: "
                   f"{', '.join(r['sent_to'])}")
    elif not r["command"] and r["kind"] != "signing":
        out.append(f"      connects to: {', '.join(r['sent_to'])}")
    return [inert(line) for line in out]      # the text is the policy's: no control reaches the terminal


def cmd_trust(args):
    from ..hostcmd import trust
    project = find_project()
    if args.revoke:
        n = trust.revoke(project.root)
        if args.json:
            out({"revoked": n})
        else:
            print(f"{n} approval(s) revoked for {project.root}")
        return 0
    if args.list:
        rows = [{"digest": d, **r} for d, r in sorted(trust.approvals(project.root).items())]
        if args.json:
            out({"approved": rows})
        elif not rows:
            print("nothing approved for this project")
        else:
            for r in rows:
                print(inert(f"  {r.get('approved_at', '')} {r.get('where', '')}: {r.get('what', '')}"))
                print(inert(f"      {r.get('text', '')}"))
        return 0
    pol = _policy(project)
    try:
        trust.check_place(pol)
    except trust.Untrusted as e:
        raise Usage(str(e), EXIT_FAILED) from None
    have = trust.approvals(project.root)
    rows = [_row(e, e["org"] or e["digest"] in have) for e in pol.host_entries]
    new = [r for r in rows if not r["trusted"]]
    if not args.json:
        if not rows:
            print("envgit.yaml names no credentials and no MCP servers")
        else:
            print("what the policy makes this machine read, run or connect to, outside the sandbox:")
            for r in rows:
                print("\n".join(_lines(r)))
    if new and not args.yes:
        if args.json or not sys.stdin.isatty():
            raise Usage(f"{len(new)} entr{'y' if len(new) == 1 else 'ies'} not trusted; review them and run "
                        "`envgit trust --yes`", EXIT_FAILED)
        answer = input(f"Trust these {len(new)} entr{'y' if len(new) == 1 else 'ies'} on this machine? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing approved")
            return EXIT_FAILED
    if new or any(not r["organisation"] for r in rows):
        trust.approve(pol)              # the current set: an old text's approval is dropped
    if args.json:
        out({"entries": [{**r, "trusted": True} for r in rows]})
    elif new:
        print(f"{len(new)} entr{'y' if len(new) == 1 else 'ies'} trusted")
    return 0
