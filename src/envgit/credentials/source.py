"""Reading a credential's real value on the host, in the daemon, when a request needs it.

Sources: `env` (the daemon's environment: the person's `envgit run` that started it),
`command` (run on the host, outside any sandbox, from outside the project: hostcmd/run.py; its
output cached for the session), `file` ('~/' allowed), `profile` (an AWS profile of
~/.aws/credentials). A project's credential, of any kind, is read under its policy only once
the person approved it with the hosts it is sent to (`envgit trust`, hostcmd/trust.py): its
envgit.yaml came with a cloned repository, and would otherwise send the person's variable or
file where it says. Values are cached for the session and never logged: errors name the
source, never its output.
"""

import configparser
import os
import subprocess

COMMAND_TIMEOUT = 30


class CredentialError(Exception):
    """A source that does not resolve; the message names the source, never a value."""


def _home(environ) -> str:
    return environ.get("HOME") or os.path.expanduser("~")


def trusted(name: str, source: dict, policy, environ) -> None:
    """CredentialError unless credential `name` of `policy` is `source` and, a project's,
    approved as it stands (source, hosts, methods, paths): the one-line error names
    envgit.yaml:LINE and `envgit trust`."""
    from ..hostcmd.trust import Untrusted, require
    from ..policy.hostentries import credential_approves
    cred = (getattr(policy, "credentials", None) or {}).get(name)
    try:
        if cred is None or cred.get("from") != source:
            raise Untrusted(f"{policy.path}: credential {name}: not as the loaded policy names "
                            "it; review it with `envgit trust`")
        require(policy, "credential", name, credential_approves(cred), environ)
    except Untrusted as e:
        raise CredentialError(str(e)) from None


def read(name: str, source: dict, environ=os.environ, policy=None) -> dict[str, str]:
    """The real value(s): {"token": …}, or for a profile {"key_id", "secret", "session"?}.
    With the `policy` that names it, only once trusted (`trusted`); every value that is sent
    anywhere is read so (the gate's Sources, `envgit doctor`). Without one, a `command` is
    refused, and the others are read to compare only (sandbox/environ.py puts placeholders in
    place of real values a step's environment would hold: nothing is sent)."""
    (kind, where), = source.items()
    if policy is not None and kind != "command":        # a command's runner checks it itself
        trusted(name, source, policy, environ)
    if kind == "env":
        value = environ.get(where, "")
        if not value:
            raise CredentialError(f"credential {name}: the variable {where} is not set in the "
                                  "environment of the `envgit run` that started the session "
                                  "(set it there; `envgit stop` ends the old session)")
        return {"token": value}
    if kind == "file":
        path = os.path.join(_home(environ), where[2:]) if where.startswith("~/") else where
        try:
            with open(path, encoding="utf-8") as f:
                value = f.read().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise CredentialError(f"credential {name}: cannot read {path}: "
                                  f"{getattr(e, 'strerror', None) or type(e).__name__}") from None
        if not value:
            raise CredentialError(f"credential {name}: {path} is empty")
        return {"token": value}
    if kind == "command":
        from ..hostcmd.run import HostCommandError, run_credential
        from ..hostcmd.trust import Untrusted
        if policy is None:
            raise CredentialError(f"credential {name}: a command source is run only under the "
                                  "policy that names it")
        try:
            r = run_credential(policy, name, where, environ, COMMAND_TIMEOUT)
        except (Untrusted, HostCommandError) as e:
            raise CredentialError(str(e)) from None
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CredentialError(f"credential {name}: the command {where!r} did not run "
                                  f"({type(e).__name__})") from None
        value = r.stdout.strip()
        if r.returncode != 0 or not value:
            raise CredentialError(f"credential {name}: the command {where!r} exited "
                                  f"{r.returncode}" + ("" if value else " with no output"))
        return {"token": value}
    if kind == "profile":
        path = environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(_home(environ), ".aws", "credentials")
        cp = configparser.RawConfigParser()
        try:
            cp.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError):
            raise CredentialError(f"credential {name}: {path} cannot be read as an ini file") from None
        if not cp.has_section(where) or not cp.has_option(where, "aws_access_key_id") \
                or not cp.has_option(where, "aws_secret_access_key"):
            raise CredentialError(f"credential {name}: no profile [{where}] with an access key "
                                  f"and secret in {path}")
        out = {"key_id": cp.get(where, "aws_access_key_id").strip(),
               "secret": cp.get(where, "aws_secret_access_key").strip()}
        if cp.has_option(where, "aws_session_token"):
            out["session"] = cp.get(where, "aws_session_token").strip()
        return out
    raise CredentialError(f"credential {name}: unknown source {kind!r}")


def require_botocore() -> None:
    """An AWS profile's requests are re-signed with botocore (the optional `aws` extra)."""
    from ..extras import MissingExtra, need
    try:
        need("aws")
    except MissingExtra as e:
        raise CredentialError(str(e)) from None     # names botocore and `pip install 'envgit[aws]'`


class Sources:
    """The session's real values, read on first need and cached (a `command:` runs once).
    A source that changed in the policy is read afresh."""

    def __init__(self, environ=None):
        self.environ = dict(os.environ if environ is None else environ)
        self._cache: dict[tuple, dict[str, str]] = {}

    def value(self, name: str, source: dict, policy=None) -> dict[str, str]:
        """The real value(s); under `policy` (the gate's every use) only while it is trusted
        as the policy now stands: a cached value too (a changed `hosts:` is asked again)."""
        key = (name, tuple(sorted(source.items())))
        if policy is not None:
            trusted(name, source, policy, self.environ)
        if key not in self._cache:
            got = read(name, source, self.environ, policy)
            if "command" in source and policy is not None and \
                    name not in getattr(policy, "org_credentials", ()):
                self._not_the_orgs(name, got, policy)
            self._cache[key] = got
        return self._cache[key]

    def _not_the_orgs(self, name: str, got: dict[str, str], policy) -> None:
        """A project's command source may not hand over an organisation credential's value
        (however the command came by it) unless the organisation sends that value to every
        host this credential goes to: it would reach hosts the organisation never allowed."""
        hosts = set(policy.credentials[name]["hosts"])
        for oname in getattr(policy, "org_credentials", ()):
            ocred = policy.credentials.get(oname)
            if ocred is None or hosts <= set(ocred["hosts"]):
                continue
            try:
                theirs = self.value(oname, ocred["from"], policy)
            except CredentialError:
                continue                # unreadable here: nothing to compare, nothing to leak
            for real in theirs.values():
                if len(real) >= 8 and any(real in v for v in got.values()):
                    raise CredentialError(
                        f"credential {name}: its command printed the value of the "
                        f"organisation's credential {oname}, which is sent only to "
                        f"{', '.join(ocred['hosts'])}; refused (the value is not used or shown)")

    def resolved(self, name: str, source: dict) -> dict[str, str] | None:
        """The real value(s) if read already, else None (never reads: the gate looks for a
        real value leaving only once it has handed it out)."""
        return self._cache.get((name, tuple(sorted(source.items()))))

    def __len__(self):                      # how many have been read (the gate's cache key)
        return len(self._cache)

    def __repr__(self):                     # never the values, whatever prints this
        return f"<Sources: {len(self._cache)} cached>"
