"""Job keys and sealed store values: what proves that a value in the store came from this job.

Anyone who reaches the store's port can read, write and delete any key (torch's TCPStore has no
authentication). ddptop therefore (1) keeps every key written after the join handshake under a *secret
namespace* derived from the job token, so a stranger cannot find, overwrite or delete them, and (2) seals
every value a peer reads: `MAC \n body`, an HMAC-SHA256 over a context string (what the value is, the job
id, the rank / sequence / request id it belongs to) and the body, so a value moved to another key, another
job or another request does not verify either.

Two keys: the *control* key is the token itself (requests, responses, status: `ddptop ctl`, the front and
rank 0 know it); the *ranks* key is derived from the token and the job id and handed by rank 0 to every rank
over the process group (telemetry, heartbeats, decisions), so even ranks started without the token (torchrun,
Slurm) sign what they send with a key a stranger on the port never sees.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

PROTOCOL = b"ddptop-auth-1"
MAC_HEX = 64  # SHA-256 in hex
NAMESPACE_HEX = 24  # 96 bits: a name nobody finds by trying (the store cannot list its keys)


class BadValue(ValueError):
    """A store value that is too large, unsigned, signed with another key or for another place, or malformed."""


def token_bytes(token: str) -> bytes:
    """The token's bytes; a token typed with bytes that are not UTF-8 (surrogate escapes in argv) keeps them."""
    return token.encode("utf-8", "surrogateescape")


def _mac(key: bytes, context: str, body: bytes) -> str:
    data = PROTOCOL + b"\0" + context.encode("utf-8", "surrogateescape") + b"\0" + body
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def seal(key: bytes, context: str, body: bytes) -> bytes:
    """`body` with a MAC that binds it to `key` and `context`."""
    return _mac(key, context, body).encode() + b"\n" + body


def unseal(key: bytes, context: str, blob: object, max_bytes: int) -> bytes:
    """The body of a sealed value, or BadValue saying why it is refused (checked before any parsing)."""
    if not isinstance(blob, (bytes, bytearray)):
        raise BadValue(f"expected bytes, got {type(blob).__name__}")
    if len(blob) > max_bytes + MAC_HEX + 1:
        raise BadValue(f"value of {len(blob)} bytes is over the {max_bytes}-byte cap")
    signature, sep, body = bytes(blob).partition(b"\n")
    if not sep or len(signature) != MAC_HEX:
        raise BadValue("value is not signed")
    if not key or not hmac.compare_digest(signature, _mac(key, context, body).encode()):
        raise BadValue("bad MAC: wrong token, another job, or an altered or moved value")
    return body


def derive(key: bytes, purpose: str) -> bytes:
    return hmac.new(key, PROTOCOL + b"\0" + purpose.encode(), hashlib.sha256).digest()


def namespace(token: str) -> str:
    """The secret key prefix of every job run with this token."""
    return derive(token_bytes(token), "namespace").hex()[:NAMESPACE_HEX]


def new_job_id() -> str:
    return secrets.token_hex(16)


@dataclass(frozen=True)
class JobKeys:
    """What a process of the job knows. `control` is empty on a rank started without the token."""

    job_id: str
    ranks: bytes
    namespace: str
    control: bytes = b""

    @classmethod
    def from_token(cls, token: str, job_id: str) -> "JobKeys":
        control = token_bytes(token)
        return cls(job_id, derive(control, "ranks " + job_id), namespace(token), control)

    # rank 0 hands (job id, ranks key, namespace) to the other ranks as one fixed-size block of bytes
    PACKED = 16 + 32 + NAMESPACE_HEX // 2

    def pack(self) -> bytes:
        return bytes.fromhex(self.job_id) + self.ranks + bytes.fromhex(self.namespace)

    @classmethod
    def unpack(cls, blob: bytes, control: bytes = b"") -> "JobKeys":
        if len(blob) != cls.PACKED:
            raise BadValue(f"job keys of {len(blob)} bytes, expected {cls.PACKED}")
        return cls(blob[:16].hex(), bytes(blob[16:48]), blob[48:].hex(), control)
