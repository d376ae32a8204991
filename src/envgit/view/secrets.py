"""Which paths' contents are withheld when envgit shows a snapshot (`envgit diff`, `envgit cat`,
the page): those the policy denies to steps, unless the person asked."""

import os

from .errors import Refused


class Secrets:
    """Which paths' contents are withheld: those the policy denies to steps (deny_read, by name
    or, for *.pem/*.key, by holding a private key), unless the person asked (`shown`).
    A person reads envgit's output on screens, in logs and in pasted issues; the file was
    denied because it should not be in any of them."""

    def __init__(self, project, shown: bool):
        self.root, self.shown, self.rules = project.root, shown, None
        if shown:
            return
        # Names found to be another way to a denied file (a hard link, a path through a
        # symlinked directory: sandbox/aliases.py), withheld in every snapshot.
        from ..sandbox import aliases
        self.aliases = set(aliases.load(project.state))
        from ..policy import PolicyError, load_policy, resolve
        try:
            pol = load_policy(project.policy)
        except PolicyError as e:
            raise Refused(f"{e} (needed to know which files are secrets; --show-secrets skips it)") from None
        self.rules = resolve(pol, project.root, os.path.expanduser("~"))

    def reason(self, path: bytes, contents=()) -> str | None:
        """Why the content of `path` (project-relative) is withheld, or None to show it.
        `contents`: its versions (bytes or None), or a function giving them, called only
        when a rule looks inside (*.pem, *.key)."""
        rules = self.rules
        if rules is None:        # shown: the policy was not even read (see __init__)
            return None
        from ..policy import defaults, is_denied
        from ..policy.decide import _deepest, _rel, _rx
        rel = os.fsdecode(path)
        full = os.path.join(self.root, rel)
        hit = is_denied(rules, full)
        if hit:
            return f"deny_read {hit}"
        if full in self.aliases:
            return "another name of a file the policy denies (a hard link or a symlinked directory)"
        for pattern, marker in defaults.DENY_READ_IF_CONTAINS.items():
            if not _rx(pattern).match(rel):
                continue
            if callable(contents):
                contents = contents()
            if any(c and marker in c for c in contents):
                depth, _ = _deepest(rules, full, _rel(self.root, full), rules.allow_abs, rules.allow_rel)
                if depth < full.count("/"):      # an allow_read naming the file lifts it
                    return f"deny_read {pattern} (it holds a private key)"
        return None
