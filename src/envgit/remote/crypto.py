"""Sealing objects for a remote (docs/FORMAT.md, "Keys and encryption"): AES-256-GCM from
`cryptography`, a fresh random nonce per object, the object's name as associated data so an
object moved under another name does not open; pack names as keyed BLAKE3 of the pack id."""

import os

from blake3 import blake3
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAGIC = b"envgit-remote-1\n"
NONCE = 12
_ENCRYPT_CONTEXT = "envgit 2026-12 remote encrypt v1"
_NAMES_CONTEXT = "envgit 2026-12 remote names v1"


class Unopenable(Exception):
    """An object that is not a sealed envelope of this key and name: altered, moved, or
    sealed with another key."""


class Sealer:
    def __init__(self, key: bytes):
        self._aead = AESGCM(blake3(key, derive_key_context=_ENCRYPT_CONTEXT).digest())
        self._names = blake3(key, derive_key_context=_NAMES_CONTEXT).digest()

    def seal(self, name: str, plaintext) -> bytes:
        nonce = os.urandom(NONCE)
        return MAGIC + nonce + self._aead.encrypt(nonce, bytes(plaintext), name.encode())

    def open(self, name: str, data: bytes) -> bytes:
        if not data.startswith(MAGIC) or len(data) < len(MAGIC) + NONCE + 16:
            raise Unopenable(f"{name}: not an envgit remote object")
        nonce = data[len(MAGIC):len(MAGIC) + NONCE]
        try:
            return self._aead.decrypt(nonce, data[len(MAGIC) + NONCE:], name.encode())
        except InvalidTag:
            raise Unopenable(f"{name}: fails authentication (altered on the bucket, moved from "
                             "another name, or sealed with another key)") from None

    def pack_name(self, pack_id: str) -> str:
        """The bucket name of a pack (and its index): reveals nothing of the pack id."""
        return blake3(bytes.fromhex(pack_id), key=self._names).hexdigest()


def new_key() -> bytes:
    return os.urandom(32)
