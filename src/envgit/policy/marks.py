"""What a step's end says about it: its marks and the notices its terminal is shown, from what
the daemon found after it (`Found`). Pure: the daemon does the looking (the snapshot, the escape
routes and what was taken back, the setuid bits stripped, the VM's write-back) and hands the
results here; this module only decides which marks they earn and how each is said, in the
order the checks below are listed.

Marks are the journal's words (docs/FORMAT.md, "Marks"): a step's end carries them, `envgit
log` filters by them, the export and the page show them.
"""

import os
from dataclasses import dataclass, field

from ..inert import some
from ..paths import POLICY_FILE, STATE_DIR


@dataclass
class Found:
    """What the daemon found after a step (daemon/steps.py `end`)."""
    step: int
    summary: dict                           # the snapshot's summary, or {"error": why}
    denied: list[str] = field(default_factory=list)       # denied paths its command line names
    requests: list[dict] = field(default_factory=list)    # its network requests, as recorded
    client_marks: list = field(default_factory=list)      # what its client said (agent-edit, …)
    unreached: list[str] = field(default_factory=list)    # hosts it looked up and could not reach, said
    escapes: list[str] = field(default_factory=list)      # escape routes it wrote (sandbox/routes.py)
    taken_back: list[str] = field(default_factory=list)   # of those, the ones brought back (takeback.py)
    tool_files: list[str] = field(default_factory=list)   # of those, package managers' own (routes.tools_own)
    policy_files: list[str] = field(default_factory=list)  # nested envgit.yaml / .envgit it made
    stripped: list[str] = field(default_factory=list)     # setuid/setgid bits removed (special_bits.py)
    vm_after: dict | None = None            # the VM's write-back (vm/host.py `after`)
    memory: dict | None = None              # the VM's memory snapshot (vm/memstore.py)


def request_marks(requests):
    marks = []
    if any(r.get("decision") == "deny" or r.get("answer") == "deny" for r in requests):
        marks.append("denied-net")
    if any(r.get("decision") == "ask" for r in requests):
        marks.append("asked")
    if any(r.get("irreversible") for r in requests):
        marks.append("irreversible")
    if any(r.get("rule") == "credential-misuse" for r in requests):
        marks.append("credential-misuse")      # a placeholder sent where its credential may not go
    return marks


def policy_files_written(summary):
    """Paths the step created, changed or removed that name a policy or a project's state
    (`envgit.yaml`, `.envgit`) anywhere below the root: a nested project a step made for itself.
    (find_project refuses one; this says which step made it.)"""
    out = []
    for p in (summary or {}).get("paths", []):
        parts = p["path"].split("/")
        # (the root's envgit.yaml is read-only to a step: a change there is the person's)
        if len(parts) > 1 and (parts[-1] == POLICY_FILE or STATE_DIR in parts):
            out.append(p["path"])
    return out


def mentioned(argv, masked, root, home):
    """The denied paths a command line names: the part of 'which denied path did the step
    touch' that can be known without tracing the process."""
    text = " ".join(argv)
    out = []
    for p in masked:
        forms = {p}
        if p.startswith(root + "/"):
            forms.add(p[len(root) + 1:])
            forms.add(os.path.basename(p))
        if home and p.startswith(home + "/"):
            forms.add("~" + p[len(home):])
        if any(f and f in text for f in forms):
            out.append(p)
    return out


# --- the checks, in the order their marks and notices appear --------------------------------
# Each takes what was found and the marks so far, and returns (marks to add, notices).

def _reads_and_requests(f, marks):
    return (["denied-read"] if f.denied else []) + request_marks(f.requests), []


def _snapshot_failed(f, marks):
    return (["snapshot-failed"] if "error" in f.summary else []), []


def _client_marks(f, marks):
    return [m for m in f.client_marks if isinstance(m, str) and m not in marks], []


def _unreached(f, marks):
    return (["denied-net"] if f.unreached and "denied-net" not in marks else []), list(f.unreached)


def _escape_routes(f, marks):
    # What package managers write on every install (a venv's programs, node_modules/.bin) is
    # listed quietly: told loudly of every `pip install`, a person stops reading what is told.
    # One taken back is the loud kind whatever its name.
    escapes, back = set(f.escapes), set(f.taken_back)
    quiet = [e for e in f.tool_files if e in escapes and e not in back]
    said_quietly = set(quiet)
    loud = [e for e in f.escapes if e not in said_quietly]
    kept = [e for e in loud if e not in back]
    notices = []
    if f.taken_back:
        notices.append("took back what it wrote to escape routes, files a program outside the "
                       "sandbox obeys (git, direnv, npm, an editor or agent): " + some(f.taken_back)
                       + f"; the step's version is in its snapshot (envgit diff {f.step}); to let "
                       "steps write one, name it in envgit.yaml's escape_routes.allow")
    if kept:
        notices.append("WROTE AN ESCAPE ROUTE, a file a program outside the sandbox obeys "
                       "(git, direnv, npm, an editor or agent): " + some(kept)
                       + f"; review before running anything here: envgit diff {f.step}; "
                       f"undo: envgit rewind {f.step}")
    if quiet:
        notices.append(f"tool-files-written: {some(quiet, 5)} (what pip, npm or a venv put where "
                       f"your shell and tools run it: envgit diff {f.step})")
    return (["escape-route-written"] if loud else []) + (["tool-files-written"] if quiet else []), notices


def _snapshot_error(f, marks):
    # said on the step's terminal, not only in the journal
    if "error" not in f.summary:
        return [], []
    return [], [f"{f.summary['error']}; the step is recorded without a snapshot, and the next "
                "step's snapshot is taken afresh"]


def _vm_write_back(f, marks):
    v, notices = f.vm_after or {}, []
    if v.get("refused"):
        notices.append("the VM's step changed paths the policy does not let a step write; they "
                       "were not copied to the project: " + ", ".join(v["refused"][:20]))
    if v.get("kept"):
        notices.append("the VM's step removed directories that, on the host, still hold what "
                       "the guest never had (denied or protected files, a repository's .git); "
                       "they were left: " + ", ".join(v["kept"][:20]))
    if v.get("edited"):
        notices.append("changed on the host while the VM's step ran: the person's version was "
                       "kept, the guest's not copied (the next step's guest gets the person's): "
                       + ", ".join(v["edited"][:20]))
    if v.get("error"):
        notices.append(v["error"])
    if f.memory and f.memory.get("error"):
        notices.append(f.memory["error"])
    return [], notices


def _policy_files(f, marks):
    if not f.policy_files:
        return [], []
    return ["policy-file-written"], [
        "policy-file-written: made or changed what would decide a project and its policy "
        "(envgit will not use it: a project inside a project is refused): " + some(f.policy_files)]


def _setuid_stripped(f, marks):
    # the seccomp filter refuses these bits: a way round it
    if not f.stripped:
        return [], []
    return ["setuid-stripped"], [
        "setuid-stripped: a setuid or setgid bit the step's files had was removed (a program "
        "anyone could run as their owner): " + ", ".join(f.stripped)]


CHECKS = (_reads_and_requests, _snapshot_failed, _client_marks, _unreached, _escape_routes,
          _snapshot_error, _vm_write_back, _policy_files, _setuid_stripped)


def after_step(found: Found) -> tuple[list[str], list[str]]:
    """The step's marks and the notices for its terminal, each check's in turn."""
    marks: list[str] = []
    notices: list[str] = []
    for check in CHECKS:
        m, n = check(found, marks)
        marks += m
        notices += n
    return marks, notices
