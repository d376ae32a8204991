"""Commit and tag signing at the gate: the host side of git's signing program inside a step
(sandbox/ssh_shim.py as ssh-keygen, pointed at by sandbox/signing.py).

A step's git asks, over the gate's ssh socket, {"op": "sign", "namespace", "payload"}. The gate:
  1. names the step by the caller's pid namespace (as for git over ssh, sshgit.py);
  2. signs only under `signing:` of the policy, approved with `envgit trust` (an organisation's
     is its own), only in namespace `git`, and only a payload that parses as what git signs: a
     commit (tree, parents, author, committer, no signature yet) or a tag (object, type, tag,
     tagger); anything else could be a signature the key's owner never meant (a login
     challenge, a file, an allowed-signers check of another program);
  3. asks the person first when `signing.action` is `ask` (envgit approve, the page);
  4. runs the person's own ssh-keygen on the host (`-Y sign -n git -f KEY`, the payload on its
     input; a .pub key signs through the person's ssh-agent), and answers the signature;
  5. records it on the step like a request: method `sign`, scheme `ssh`, host `signing`, path
     `/commit` or `/tag`, and `signed`: the object id the signed commit or tag will have, its
     author (or tagger) and its message's first line.
"""

import base64
import hashlib
import os
import re
import subprocess
import time

from ..hostcmd import trust
from ..hostcmd.writable import step_writable
from ..policy import network
from ..policy.hostentries import signing_approves
from ..sandbox.signing import key_path

SIGN_TIMEOUT_S = 30
_HEX = r"(?:[0-9a-f]{40}|[0-9a-f]{64})"
_COMMIT_HEAD = re.compile(rb"tree (" + _HEX.encode() + rb")\n")
_TAG_HEAD = re.compile(rb"object " + _HEX.encode() + rb"\ntype (commit|tree|blob|tag)\ntag [^\n]+\ntagger ")


class NotSigned(Exception):
    """One `envgit:` line saying why nothing was signed."""


def what_is_signed(payload: bytes) -> dict:
    """{kind: commit|tag, author, subject, hex_len} of a payload git asks to sign; NotSigned
    when it is neither a commit without a signature nor a tag."""
    head, sep, message = payload.partition(b"\n\n")
    if not sep:
        raise NotSigned("envgit: sign: not a commit or tag (no header end): not signed")
    lines = head.split(b"\n")
    names = [ln.split(b" ", 1)[0] for ln in lines if ln and not ln.startswith(b" ")]
    m = _COMMIT_HEAD.match(payload)
    if m:
        if not {b"author", b"committer"} <= set(names) or any(n.startswith(b"gpgsig") for n in names):
            raise NotSigned("envgit: sign: a commit needs author and committer and no signature yet: not signed")
        kind, who_key, hex_len = "commit", b"author ", len(m.group(1))
    elif _TAG_HEAD.match(payload):
        if b"-----BEGIN" in message:
            raise NotSigned("envgit: sign: the tag is signed already: not signed")
        kind, who_key, hex_len = "tag", b"tagger ", len(payload.split(b"\n", 1)[0]) - len(b"object ")
    else:
        raise NotSigned("envgit: sign: only a commit or a tag is signed through the gate: not signed")
    # once each: git shows a commit's last author header, the record would name its first
    once = (b"tree", b"author", b"committer") if kind == "commit" else (b"object", b"type", b"tag", b"tagger")
    if any(names.count(n) != 1 for n in once):
        raise NotSigned(f"envgit: sign: a {kind} names its {', '.join(n.decode() for n in once)} once each: "
                        "not signed")
    # git shows a message re-encoded from the encoding its header names; the record reads UTF-8
    encodings = [ln[len(b"encoding "):].strip() for ln in lines if ln.startswith(b"encoding ")]
    if names.count(b"encoding") > len(encodings) or any(e.lower() not in (b"utf-8", b"utf8") for e in encodings) \
            or len(encodings) > 1:
        raise NotSigned(f"envgit: sign: a {kind} in encoding {_shown(b' '.join(encodings) or b'?')} is not "
                        "signed through the gate: leave git's i18n.commitEncoding unset (UTF-8)")
    who = next((ln[len(who_key):] for ln in lines if ln.startswith(who_key)), b"")
    who = re.sub(rb" \d+ [+-]\d{4}$", b"", who)
    return {"kind": kind, "author": _shown(who), "subject": _shown(_subject(message)), "hex_len": hex_len}


def _subject(message: bytes) -> bytes:
    """git's subject: the message's first paragraph (after blank lines), its lines joined by a
    space, each without its trailing whitespace."""
    out: list[bytes] = []
    for ln in message.split(b"\n"):
        ln = ln.rstrip(b" \t\r")
        if ln:
            out.append(ln)
        elif out:
            break
    return b" ".join(out)


def _shown(text: bytes) -> str:
    """Text for the record, with control characters written out (a terminal escape in a
    subject would rewrite the line `envgit show` prints)."""
    s = text.decode("utf-8", "replace")
    return "".join(c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}")
                   for c in s)[:300]


def pinned(payload: bytes) -> dict:
    """What the signature fixes whatever the object's final id: a commit's tree and parents, a
    tag's target. A step may move the signature header among the headers it was given, which
    makes another id for the same signed content: these match such an object to its record."""
    head = payload.partition(b"\n\n")[0].split(b"\n")
    field: dict[bytes, list[str]] = {b"tree": [], b"parent": [], b"object": []}
    for ln in head:
        name, _, value = ln.partition(b" ")
        if name in field:
            field[name].append(value.decode("ascii", "replace"))
    if field[b"tree"]:
        return {"tree": field[b"tree"][0], "parents": field[b"parent"]}
    return {"target": field[b"object"][0]} if field[b"object"] else {}


def object_id(kind: str, payload: bytes, signature: str, hex_len: int) -> str:
    """The id git gives the signed object: a commit carries the signature as a `gpgsig` header
    at the end of its headers (`gpgsig-sha256` in a SHA-256 repository), each line after a
    space; a tag has it after its message."""
    sig = signature.encode()
    if kind == "commit":
        head, _, rest = payload.partition(b"\n\n")
        name = b"gpgsig" if hex_len == 40 else b"gpgsig-sha256"
        lines = sig.splitlines(keepends=True)          # ssh-keygen's signature ends with a newline
        obj = head + b"\n" + name + b"".join(b" " + ln for ln in lines) + b"\n" + rest
    else:
        obj = payload + sig
    h = hashlib.sha1 if hex_len == 40 else hashlib.sha256
    return h(kind.encode() + b" " + str(len(obj)).encode() + b"\0" + obj).hexdigest()


def serve(gate, loop, step: int, msg: dict) -> dict:
    """One signing request of `step` (on the ssh socket's thread): the reply for the shim."""
    import asyncio
    started = time.time()
    policy = gate.policy()
    sig_cfg = getattr(policy, "signing", None)
    rec = {"method": "sign", "scheme": "ssh", "host": "signing", "port": 0, "path": "/", "status": None,
           "bytes_up": 0, "bytes_down": 0, "intercepted": True, "irreversible": False,
           "started_at": started, "rule": "signing", "kind": "signing"}
    try:
        if not sig_cfg:
            raise NotSigned("envgit: sign: no signing key in envgit.yaml: add `signing: {key: "
                            "~/.ssh/id_ed25519}` (then `envgit trust`) for the gate to sign commits")
        try:
            trust.require(policy, "signing", "key", signing_approves(sig_cfg))
        except trust.Untrusted as e:
            raise NotSigned(f"envgit: sign: {e}") from None
        key = key_path(sig_cfg)
        if step_writable(policy, key, os.environ):
            # the path is what was approved, not the key: a step could put its own key there,
            # or a link to another of the person's keys, between the approval and this request
            raise NotSigned(f"envgit: sign: signing.key {key} is inside the project (or another place a "
                            "step can write): move the key outside it (e.g. ~/.ssh/) and name it there "
                            "in envgit.yaml, then `envgit trust`")
        if msg.get("namespace") != "git":
            raise NotSigned("envgit: sign: only git's namespace is signed through the gate")
        try:
            payload = base64.b64decode(str(msg.get("payload") or ""), validate=True)
        except ValueError:
            raise NotSigned("envgit: sign: the payload is not base64") from None
        facts = what_is_signed(payload)
        rec.update(path="/" + facts["kind"], bytes_up=len(payload))
        if (sig_cfg.get("action") or "allow") == "ask":
            question = {"method": "sign", "scheme": "ssh", "host": "signing", "port": 0,
                        "path": "/" + facts["kind"], "rule": "signing", "kind": "signing",
                        "reason": f"sign the {facts['kind']} '{facts['subject']}' by {facts['author']}",
                        "step": step, "query_sha256": hashlib.sha256(payload).hexdigest(),
                        "method_override": [], "rewrite_paths": [],
                        "covers": {"allow": "this signature only",
                                   "allow-rule": "every signature for the rest of this step"}}
            d = network.Decision("ask", "signing", question["reason"], kind="signing")
            fut = asyncio.run_coroutine_threadsafe(
                gate.ask_once(step, ("sign", question["query_sha256"]), question, d), loop)
            answer, who, how, at = fut.result()
            rec.update(answer=answer, answered_by=who, answered_how=how, answered_at=at)
            if answer != "allow":
                raise NotSigned(f"envgit: sign: not approved ({how}): the {facts['kind']} is not signed")
        signature = _sign(key, payload)
        rec.update(decision="allow", reason="signing: the policy's key",
                   signed={"kind": facts["kind"], "author": facts["author"], "subject": facts["subject"],
                           "object": object_id(facts["kind"], payload, signature, facts["hex_len"]),
                           **pinned(payload)},
                   bytes_down=len(signature), duration_ms=round((time.time() - started) * 1000, 3))
        gate.emit(step, rec)
        return {"signature": signature}
    except NotSigned as e:
        rec.update(decision="deny", reason=str(e).removeprefix("envgit: sign: ")[:1000],
                   duration_ms=round((time.time() - started) * 1000, 3))
        gate.emit(step, rec)
        return {"error": str(e), "exit": 1}


def _sign(key: str, payload: bytes) -> str:
    """The person's ssh-keygen signs on the host (a .pub key: through their ssh-agent)."""
    argv = ["ssh-keygen", "-Y", "sign", "-n", "git", "-f", key] + (["-U"] if key.endswith(".pub") else [])
    try:
        r = subprocess.run(argv, input=payload, capture_output=True, timeout=SIGN_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NotSigned(f"envgit: sign: ssh-keygen could not sign ({e})") from None
    out = r.stdout.decode("ascii", "replace")
    if r.returncode != 0 or "-----BEGIN SSH SIGNATURE-----" not in out:
        err = r.stderr.decode("utf-8", "replace").strip().splitlines()
        raise NotSigned(f"envgit: sign: ssh-keygen on the host failed: {err[-1] if err else r.returncode} "
                        f"(signing.key {key} in envgit.yaml: a key without a passphrase, or its .pub "
                        "with the key in your ssh-agent)")
    return out
