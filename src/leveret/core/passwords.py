"""Password hashes as RabbitMQ makes them, so definitions move between the two brokers
with working passwords.

RabbitMQ (``rabbit_password``) stores ``base64(salt + H(salt + utf8(password)))`` with a
4-byte random salt; ``H`` is named by the user's ``hashing_algorithm``:
``rabbit_password_hashing_sha256`` (the default since 3.6), ``..._sha512`` or
``..._md5`` (older exports). A user without a password has an empty hash and cannot log
in with one (RabbitMQ: only by another mechanism, such as EXTERNAL).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

SHA256 = "rabbit_password_hashing_sha256"
SHA512 = "rabbit_password_hashing_sha512"
MD5 = "rabbit_password_hashing_md5"
DEFAULT_ALGORITHM = SHA256
_HASHES = {SHA256: hashlib.sha256, SHA512: hashlib.sha512, MD5: hashlib.md5}
SALT_SIZE = 4  # bytes, as RabbitMQ


class HashError(ValueError):
    """An unknown hashing algorithm or a malformed ``password_hash``."""


def hash_password(password: str, algorithm: str = DEFAULT_ALGORITHM) -> str:
    """``password``'s hash in RabbitMQ's form (base64 text) with a fresh random salt.
    Raises HashError for an unknown ``algorithm``."""
    return _hash(os.urandom(SALT_SIZE), password, algorithm)


def check_password(password: str, password_hash: str, algorithm: str = DEFAULT_ALGORITHM) -> bool:
    """Whether ``password`` matches ``password_hash`` (constant-time compare); False for
    an empty or malformed hash."""
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(raw) <= SALT_SIZE:
        return False
    try:
        expected = _hash(raw[:SALT_SIZE], password, algorithm)
    except HashError:
        return False
    return hmac.compare_digest(expected, password_hash)


def validate(password_hash: str, algorithm: str) -> None:
    """Raise HashError unless ``password_hash`` could have been made by ``algorithm``
    (empty: no password)."""
    if algorithm not in _HASHES:
        raise HashError(f"unknown hashing algorithm '{algorithm}'")
    if not password_hash:
        return
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        raise HashError("password_hash is not base64") from None
    if len(raw) != SALT_SIZE + _HASHES[algorithm]().digest_size:
        raise HashError(f"password_hash has the wrong length for {algorithm}")


def _hash(salt: bytes, password: str, algorithm: str) -> str:
    try:
        function = _HASHES[algorithm]
    except KeyError:
        raise HashError(f"unknown hashing algorithm '{algorithm}'") from None
    return base64.b64encode(salt + function(salt + password.encode()).digest()).decode()
