"""Remotes: a project's packs, indexes and journal on S3-compatible object storage, encrypted.

The layout is in docs/FORMAT.md ("Remote"). layout.py names things and keeps the local
configuration, crypto.py seals and opens objects, s3.py talks to the bucket (boto3, imported
only here), push.py uploads, read.py reads (log, restore, fsck, audit).
Never imported by the hot path: only by `envgit remote/push/audit`, `log --remote`,
`restore --from`, `fsck --remote` and the daemon's auto-push.
"""


class RemoteError(Exception):
    """An operational failure of a remote (its configuration, key, bucket or contents), said
    in one line with the fix."""
