"""Job keys: the token stretched, and every key derived from it. Nothing here tags or checks a message.

Anyone who reaches the store's port can list, read, write and delete any key (torch's TCPStore has no
authentication), so nothing of ddptop's goes there but the public keys (and, in a job without a token, its join in
clear): the join of a job with a token and everything after it travel over the front's ZeroMQ sockets with CURVE
(transport.py, libzmq: the only handshake, MAC and framing), whose keys derive from the ones here.

The *control* key is stretched from the token with scrypt and a random per-job salt (stretch: each guess at a
token costs an attacker SCRYPT_N's milliseconds, and nothing can be precomputed before the job starts); every
CURVE key of the job derives from it (transport.secret). The *ranks* key derives from it and the job id: ranks
that know the token derive it, ranks started without it (torchrun, Slurm) get it from rank 0 over the process
group (worker.share_job_keys); it is the rank role's CURVE secret, which may only PUSH telemetry.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

PROTOCOL = b"ddptop-auth-1"
NAMESPACE_HEX = 24  # 96 bits; not a secret (torch >= 2.x lists every key to anyone): keeps jobs apart


class BadValue(ValueError):
    """A value read from the network that is too large, for another job or request, or malformed."""


def token_bytes(token: str) -> bytes:
    """The token's bytes; a token typed with bytes that are not UTF-8 (surrogate escapes in argv) keeps them."""
    return token.encode("utf-8", "surrogateescape")


def derive(key: bytes, purpose: str) -> bytes:
    """A key for `purpose` (a role's CURVE secret, the ranks key, the namespace): HMAC-SHA256 as a key derivation."""
    return hmac.new(key, PROTOCOL + b"\0" + purpose.encode(), hashlib.sha256).digest()


# scrypt's cost: 2**14 x 8 x 128 bytes = 16 MiB and ~50 ms per derivation on one core (benchmarks/guess_cost.py);
# every process derives once per job, a guesser once per guess and salt
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 14, 8, 1
SALT_BYTES = 16


def new_salt() -> bytes:
    return secrets.token_bytes(SALT_BYTES)


def stretch(token: str, salt: bytes) -> bytes:
    """The job's control key: scrypt over the token and the job's salt (published in the store: not a secret)."""
    return hashlib.scrypt(token_bytes(token), salt=PROTOCOL + salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P,
                          maxmem=64 << 20, dklen=32)


def namespace(control: bytes) -> str:
    """The key prefix of the job's process-group keys when every rank knows the token."""
    return derive(control, "namespace").hex()[:NAMESPACE_HEX]


def new_job_id() -> str:
    return secrets.token_hex(16)


@dataclass(frozen=True)
class JobKeys:
    """What a process of the job knows. `control` is empty on a rank started without the token, which gets the ranks
    key and the front's public key (`server`) from rank 0 instead (transport.py)."""

    job_id: str
    ranks: bytes
    namespace: str
    control: bytes = b""
    server: bytes = b""

    @classmethod
    def from_token(cls, token: str, job_id: str, salt: bytes) -> "JobKeys":
        return cls.from_control(stretch(token, salt), job_id)

    @classmethod
    def from_control(cls, control: bytes, job_id: str) -> "JobKeys":
        return cls(job_id, derive(control, "ranks " + job_id), namespace(control), control)

    # rank 0 hands (job id, ranks key, namespace, the front's public key) to ranks started without the token as one
    # fixed-size block of bytes; ranks that know the token get the job id alone (the rest zeros) and derive the keys
    PACKED = 16 + 32 + NAMESPACE_HEX // 2 + 32

    def pack(self, server: bytes, secret: bool) -> bytes:
        """`secret`: with the ranks key and the front's key (for ranks without the token), else zeros there."""
        if not secret:
            return bytes.fromhex(self.job_id) + bytes(self.PACKED - 16)
        return bytes.fromhex(self.job_id) + self.ranks + bytes.fromhex(self.namespace) + server

    @classmethod
    def unpack(cls, blob: bytes) -> "JobKeys":
        if len(blob) != cls.PACKED:
            raise BadValue(f"job keys of {len(blob)} bytes, expected {cls.PACKED}")
        return cls(blob[:16].hex(), bytes(blob[16:48]), blob[48:60].hex(), b"", bytes(blob[60:]))
