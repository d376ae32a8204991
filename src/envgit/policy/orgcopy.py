"""Where the copy of a remote's organisation policy lives, and what it was fetched from:
read here, never written (remote/orgpolicy.py fetches the object from the bucket, checks it and
writes both files; org.locate reads the copy when /etc/envgit/policy.yaml and
$ENVGIT_ORG_POLICY name none). The daemon never fetches on a step's way: a step's policy is the
last copy fetched.

    $XDG_CONFIG_HOME/envgit/org/source.json   {"remote", "object", "url", "sha256", "fetched_at"}
    $XDG_CONFIG_HOME/envgit/org/policy.yaml   the object's bytes, as last fetched and checked
"""

import json
import os

from .schema import PolicyError


def org_dir() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "envgit", "org")


def source_path() -> str:
    return os.path.join(org_dir(), "source.json")


def copy_path() -> str:
    return os.path.join(org_dir(), "policy.yaml")


def source() -> dict | None:
    """What the copy was fetched from, or None when no remote names an organisation policy."""
    try:
        with open(source_path()) as f:
            d = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise PolicyError(source_path(), 0, 0, f"not readable ({e}); run `envgit remote set "
                          "NAME --policy OBJECT` again") from None
    if not isinstance(d, dict) or not all(isinstance(d.get(k), str) for k in ("remote", "object", "url")):
        raise PolicyError(source_path(), 0, 0, "not an organisation policy's source; run "
                          "`envgit remote set NAME --policy OBJECT` again")
    return d


def label(src: dict) -> str:
    """How errors and `policy show` name the policy: the object's URL on the bucket."""
    return src["url"]


