"""Pure decisions: functions of (policy, question), no I/O, so they are tested without a sandbox.
The sandbox builds its mounts from the same matchers, so what decide_path answers is what
the mounts do."""

import os
import shlex
from dataclasses import dataclass
from functools import lru_cache

from ..paths import POLICY_FILE
from . import defaults
from .globs import compile_glob, has_magic

# Host directories shown read-only in the sandbox (when they exist). Everything else at the
# top level (/home, /root, /work, /mnt, /var, /media, /srv, /boot) is absent.
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "snap", "nix")


@dataclass(frozen=True)
class PathDecision:
    access: str            # "none" | "read" | "write"
    rule: str              # why: the policy entry or built-in rule that decided


@dataclass(frozen=True)
class CommandDecision:
    action: str            # "allow" | "deny"
    rule: str = ""
    reason: str = ""


def expand_entry(entry: str, home: str) -> list[str]:
    """A deny/allow entry as absolute paths or project globs (`browser-profiles` → its paths)."""
    if entry in defaults.GROUPS:
        return [e for g in defaults.GROUPS[entry] for e in expand_entry(g, home)]
    if entry == "~" or entry.startswith("~/"):
        return [home + entry[1:]]
    return [entry]


def credential_files(policy, home: str) -> tuple:
    """(path, entry) of every file a credential's real value is read from: denied in every
    step like a `filesystem.deny` entry (a token file others may read, /run/secrets/x at 0444,
    would be there in the step otherwise). `file:` sources ('~/' is the home), and for a
    `profile:` source the AWS shared credentials file (AWS_SHARED_CREDENTIALS_FILE of the
    session's environment, as credentials/source.py reads it, and the home's default)."""
    out = []
    for name, cred in (getattr(policy, "credentials", None) or {}).items():
        src = cred.get("from") or {}
        if isinstance(src.get("file"), str):
            f = src["file"]
            path = home + f[1:] if f.startswith("~/") else f
            if path.startswith("/"):
                out.append((os.path.normpath(path), f"credentials.{name}.from.file"))
        if "profile" in src:
            for path in (os.environ.get("AWS_SHARED_CREDENTIALS_FILE"), os.path.join(home, ".aws", "credentials")):
                if path and path.startswith("/"):
                    out.append((os.path.normpath(path), f"credentials.{name}.from.profile"))
    return tuple(out)


@dataclass(frozen=True)
class Rules:
    """A policy's path entries resolved against one project and home."""
    project: str
    home: str
    deny_abs: tuple            # (absolute path or glob, policy entry)
    deny_rel: tuple            # (project glob, policy entry)
    allow_abs: tuple
    allow_rel: tuple
    write_abs: tuple
    protect_abs: tuple


def resolve(policy, project: str, home: str) -> Rules:
    def split(entries):
        absl, rel = [], []
        for e in entries:
            for x in expand_entry(e, home):
                if x.startswith("/"):
                    absl.append((os.path.normpath(x), e))
                elif x in (".", "./"):
                    absl.append((project, e))
                elif "/" in x.rstrip("/") and not x.startswith("**") and not has_magic(x):
                    absl.append((os.path.normpath(os.path.join(project, x)), e))
                else:
                    rel.append((x, e))
        return tuple(absl), tuple(rel)
    deny_abs, deny_rel = split(policy.deny_read)
    deny_abs += credential_files(policy, home)
    allow_abs, allow_rel = split(policy.allow_read)
    write_abs, _ = split(policy.allow_write)
    # protect entries name project paths, even without a '/' (envgit.yaml itself)
    protect_abs = tuple((x if x.startswith("/") else os.path.normpath(os.path.join(project, x)), e)
                        for e in list(policy.protect) + [POLICY_FILE]
                        for x in expand_entry(e, home))
    return Rules(project, home, deny_abs, deny_rel, allow_abs, allow_rel, write_abs, protect_abs)


@lru_cache(maxsize=4096)
def _rx(pattern):
    return compile_glob(pattern.lstrip("/"))


def abs_match(entry: str, path: str) -> int:
    """How deep the absolute `entry` (which may hold a glob) names `path` or an ancestor of it:
    the number of path components of the match, 0 when it does not."""
    parts = path.lstrip("/").split("/")
    if not has_magic(entry):
        if path == entry or path.startswith(entry.rstrip("/") + "/"):
            return entry.rstrip("/").count("/")
        return 0
    rx = _rx(entry)
    return next((n for n in range(1, len(parts) + 1) if rx.match("/".join(parts[:n]))), 0)


def rel_match(pattern: str, rel: str) -> int:
    """The same for a project glob against the project-relative `rel`."""
    rx = _rx(pattern)
    parts = rel.split("/")
    return next((n for n in range(1, len(parts) + 1) if rx.match("/".join(parts[:n]))), 0)


def _deepest(rules, path, rel, abs_entries, rel_entries):
    """(depth, entry) of the most specific entry naming `path`; depth counts from `/`."""
    best = (0, None)
    for entry, source in abs_entries:
        d = abs_match(entry, path)
        if d > best[0]:
            best = (d, source)
    if rel:
        base = rules.project.count("/")
        for entry, source in rel_entries:
            d = rel_match(entry, rel)
            if d and base + d > best[0]:
                best = (base + d, source)
    return best


def is_denied(rules: Rules, path: str) -> str | None:
    """The deny entry closing `path`, unless an allow_read entry at least as specific (the
    same path or one inside the denied one) re-opens it: allowing `~/.config` does not open
    `~/.config/gh`, allowing `~/.ssh/known_hosts` does open that one file."""
    rel = _rel(rules.project, path)
    depth, hit = _deepest(rules, path, rel, rules.deny_abs, rules.deny_rel)
    if not hit:
        return None
    allow_depth, _ = _deepest(rules, path, rel, rules.allow_abs, rules.allow_rel)
    return None if allow_depth >= depth else hit


def _rel(project, path):
    if path == project:
        return ""
    if path.startswith(project + "/"):
        return path[len(project) + 1:]
    return None


def decide_path(policy, path: str, project: str, home: str) -> PathDecision:
    """What a step may do to the absolute `path`: nothing, read it, or write it."""
    return decide_resolved(resolve(policy, project, home), path)


def decide_resolved(rules: Rules, path: str) -> PathDecision:
    path = os.path.normpath(path)
    rel = _rel(rules.project, path)
    if rel is not None and (rel == ".envgit" or rel.startswith(".envgit/")):
        return PathDecision("none", ".envgit is envgit's state")
    denied = is_denied(rules, path)
    if denied:
        return PathDecision("none", f"deny_read {denied}")
    for entry, source in rules.protect_abs:
        if abs_match(entry, path):
            return PathDecision("read", f"protect {source}")
    if path == "/tmp" or path.startswith("/tmp/"):
        return PathDecision("write", "the per-session /tmp")
    for entry, source in rules.write_abs:
        if abs_match(entry, path):
            return PathDecision("write", f"allow_write {source}")
    top = path.lstrip("/").split("/", 1)[0]
    if top in SYSTEM_DIRS:
        return PathDecision("read", f"system directory /{top}")
    for entry, source in rules.allow_abs:
        if abs_match(entry, path):
            return PathDecision("read", f"allow_read {source}")
    if path == rules.home:
        return PathDecision("read", "the home view (empty but for allow_read)")
    return PathDecision("none", "not part of the sandbox's view")


# --- commands ----------------------------------------------------------------------------

_SHELLS = {"sh", "bash", "dash", "zsh", "ksh"}
_WRAPPERS = {"env", "command", "exec", "nohup", "sudo", "time", "nice"}


def _simple_commands(text: str):
    lex = shlex.shlex(text, posix=True, punctuation_chars=";&|()")
    lex.whitespace_split = True
    words: list[str] = []
    try:
        for tok in lex:
            if tok and all(c in ";&|()" for c in tok):
                if words:
                    yield words
                words = []
            else:
                words.append(tok)
    except ValueError:       # unbalanced quotes: judge what was read
        pass
    if words:
        yield words


def _command_words(words):
    """The words that name what runs: assignments, wrappers and options dropped."""
    while words and ("=" in words[0] and not words[0].startswith("-") or
                     os.path.basename(words[0]) in _WRAPPERS):
        words = words[1:]
    if words and os.path.basename(words[0]) in _SHELLS and "-c" in "".join(
            w for w in words[1:2] if w.startswith("-")) and len(words) > 2:
        return None, words[2]       # a nested script: judge it as its own text
    return [os.path.basename(words[0])] + [w for w in words[1:] if not w.startswith("-") and "=" not in w] \
        if words else [], None


@lru_cache(maxsize=8192)
def _pattern_words(pattern: str) -> list:
    """A shell deny pattern's words, split once per pattern text, not once per step (shlex is
    slow: a long pattern split on every step cost minutes; the schema caps its length)."""
    try:
        return shlex.split(pattern)
    except ValueError:
        return []


def decide_command(policy, argv: list[str]) -> CommandDecision:
    """The `shell:` rules on a command line: a courtesy refusal, never the enforcement."""
    if not policy.shell:
        return CommandDecision("allow")
    if len(argv) >= 3 and os.path.basename(argv[0]) in _SHELLS and argv[1].startswith("-") and "c" in argv[1]:
        texts = [argv[2]]
    else:
        texts = [shlex.join(argv)]
    seen = 0
    while texts and seen < 16:       # nested `sh -c` scripts, bounded
        seen += 1
        text = texts.pop()
        for words in _simple_commands(text):
            cmd, nested = _command_words(words)
            if nested is not None:
                texts.append(nested)
                continue
            for i, rule in enumerate(policy.shell):
                for pattern in rule["deny"]:
                    pw = _pattern_words(pattern)
                    if pw and cmd[:len(pw)] == pw:
                        return CommandDecision("deny", f"shell[{i}] deny {pattern!r}",
                                               rule.get("reason", ""))
    return CommandDecision("allow")
