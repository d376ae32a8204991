"""AWS SigV4 re-signing at the gate, with botocore's signer (the optional `aws` dependency):
a request the step signed with the placeholder key is signed again, now, with the real key,
over exactly the headers the client signed. Presigned URLs (the signature in the query) are
not re-signed: they keep the placeholder and the service refuses them.
"""

import logging
from urllib.parse import urlsplit

logging.getLogger("botocore").setLevel(logging.WARNING)   # its debug lines hold the headers

_ALGO = "AWS4-HMAC-SHA256"


def parse(authorization: str) -> dict | None:
    """AWS4-HMAC-SHA256 Credential=KEY/DATE/REGION/SERVICE/aws4_request, SignedHeaders=a;b,
    Signature=… -> {"key_id", "date", "region", "service", "signed"}; None if not SigV4."""
    algo, _, rest = authorization.strip().partition(" ")
    if algo != _ALGO:
        return None
    fields = {}
    for part in rest.split(","):
        k, eq, v = part.strip().partition("=")
        if eq:
            fields[k] = v
    scope = fields.get("Credential", "").split("/")
    if len(scope) != 5 or "SignedHeaders" not in fields:
        return None
    return {"key_id": scope[0], "date": scope[1], "region": scope[2], "service": scope[3],
            "signed": [h for h in fields["SignedHeaders"].lower().split(";") if h]}


def _auth_class(service):
    from botocore.auth import S3SigV4Auth, SigV4Auth
    return S3SigV4Auth if service == "s3" else SigV4Auth


def sign(method, url, headers: dict, body: bytes, service, region, key_id, secret, token=None,
         timestamp: str | None = None) -> dict:
    """The signing headers (Authorization, X-Amz-Date, X-Amz-Security-Token?) for the request
    made of `headers` (the ones to sign). `timestamp` (YYYYMMDDTHHMMSSZ): sign as of then
    (a verifier), else now."""
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    req = AWSRequest(method=method, url=url, headers=dict(headers), data=body or b"")
    auth = _auth_class(service)(Credentials(key_id, secret, token), service, region)
    if timestamp is None:
        auth.add_auth(req)
    else:
        req.context["timestamp"] = timestamp
        req.headers["X-Amz-Date"] = timestamp
        if token:
            req.headers["X-Amz-Security-Token"] = token
        canonical = auth.canonical_request(req)
        sig = auth.signature(auth.string_to_sign(req, canonical), req)
        auth._inject_signature_to_request(req, sig)
    return {k: v for k, v in req.headers.items()
            if k.lower() in ("authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256")}


def resign(r, placeholder: dict, real: dict) -> bool:
    """Re-sign the mitmproxy request `r` in place if the step signed it with the placeholder
    key; False (left as it is) otherwise."""
    parsed = parse(r.headers.get("authorization", ""))
    if parsed is None or parsed["key_id"] != placeholder["key_id"]:
        return False
    signed = {k: v for k, v in ((k, r.headers.get(k)) for k in parsed["signed"])
              if v is not None and k not in ("authorization", "x-amz-date", "x-amz-security-token")}
    host = r.headers.get("host") or r.pretty_host
    url = f"{r.scheme}://{host}{r.path}"
    if not urlsplit(url).netloc:
        return False
    out = sign(r.method, url, signed, r.raw_content or b"", parsed["service"], parsed["region"],
               real["key_id"], real["secret"], real.get("session"))
    if "x-amz-security-token" in r.headers and "session" not in real:
        del r.headers["x-amz-security-token"]       # the placeholder's: the real key has none
    for k, v in out.items():
        r.headers[k] = v
    return True
