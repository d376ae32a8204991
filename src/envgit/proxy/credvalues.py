"""What the gate knows of a session's credentials, shared by its two credential addons
(credentials.py: placeholders on requests; echoguard.py: real values in answers) and by
Gate.emit (no record keeps a real value): each credential's placeholders, the real values
read, their forms in a body (credentials/echo.py). Not an addon.

Real values live in credentials.source.Sources, read on first need (a variable, file or AWS
profile as soon as a response may carry it); they are never put in a record, a log line or an
error message.
"""

from urllib.parse import quote

from ..credentials import echo
from ..credentials.placeholder import SESSION
from ..credentials.source import CredentialError, Sources
from ..policy.credcover import on_its_hosts

MIN_REAL = 8            # a real value shorter than this is not looked for (it would be everywhere)
EAGER = ("env", "file", "profile")  # sources read as soon as a response may carry their value


class CredentialValues:
    """One gate's placeholders and real values, made again only when the policy object (or the
    set of values read) changes."""

    def __init__(self, sources: Sources | None = None):
        self.sources = sources if sources is not None else Sources()
        self._made: tuple[object, dict[str, tuple[dict, list[str]]]] | None = None
        self._reals_made: tuple[object, int, dict[str, list[tuple[str, str]]]] | None = None
        self._echoes_made: tuple[dict, echo.Echoes] | None = None

    def placeholders(self, policy) -> dict[str, tuple[dict, list[str]]]:
        """name -> (its credential, its placeholder strings); made once per policy object."""
        if self._made is None or self._made[0] is not policy:
            out = {}
            for name, cred in getattr(policy, "credentials", {}).items():
                out[name] = (cred, list(SESSION.of(name, cred).values()))
            self._made = (policy, out)
        return self._made[1]

    def reals(self, policy) -> dict[str, list[tuple[str, str]]]:
        """name -> [(real value, its placeholder)] of every credential whose real value the
        gate knows: read already (and so maybe handed out: a server can echo it back into
        the step), or cheap and harmless to read now (EAGER: a variable, a file, an AWS
        profile; a server may know the value without the gate handing it out). A `command:`
        source is run only when a request needs its value. Made again only when the policy or
        the set of values read changes."""
        made = self._reals_made
        if made is not None and made[0] is policy and made[1] == len(self.sources):
            return made[2]
        out = {}
        for name, (cred, _) in self.placeholders(policy).items():
            real = self.sources.resolved(name, cred["from"])
            if real is None and next(iter(cred["from"])) in EAGER:
                try:
                    real = self.sources.value(name, cred["from"], policy)
                except CredentialError:
                    real = None             # said by `envgit doctor` and on the request needing it
            if real:
                ph = SESSION.of(name, cred)
                pairs = [(v, ph[k]) for k, v in real.items() if k in ph and len(v) >= MIN_REAL]
                if pairs:
                    out[name] = pairs
        self._reals_made = (policy, len(self.sources), out)
        return out

    def echoes(self, policy) -> echo.Echoes:
        """The real values' forms in a body (credentials/echo.py), made once per reals()."""
        reals = self.reals(policy)
        if self._echoes_made is None or self._echoes_made[0] is not reals:
            self._echoes_made = (reals, echo.Echoes(
                [(name, real, ph) for name, pairs in reals.items() for real, ph in pairs]))
        return self._echoes_made[1]

    def found(self, policy, texts) -> list[str]:
        """The credentials whose placeholder is in one of `texts`."""
        blob = "\0".join(texts)            # one search per needle (none holds a NUL)
        return [name for name, (_, phs) in self.placeholders(policy).items()
                if any(ph in blob for ph in phs)]

    def found_real(self, policy, texts) -> list[str]:
        """The credentials whose real value (as the gate knows it: reals()) is in one of `texts`."""
        reals = self.reals(policy)
        if not reals:
            return []
        blob = "\0".join(texts)
        return [name for name, pairs in reals.items() if any(real in blob for real, _ in pairs)]

    def scrub(self, policy, rec: dict) -> dict:
        """A record of a request that carried a real value (in its path, say) names the
        credential instead: real values never reach the journal."""
        reals = self.reals(policy)
        for key, v in rec.items():
            if isinstance(v, str):
                for name, pairs in reals.items():
                    for real, _ in pairs:
                        for r in (real, quote(real, safe="")):
                            v = v.replace(r, f"<credential {name}>")
                rec[key] = v
        return rec

    def on_a_credential_host(self, policy, host: str, port: int) -> bool:
        """Is host:port one of any credential's hosts (any port its entry names)?"""
        return any(on_its_hosts(cred, host, port) for cred, _ in self.placeholders(policy).values())
