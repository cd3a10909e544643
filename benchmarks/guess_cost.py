"""What one guess at a job token costs an attacker offline (issue 27: ~336k guesses/s against the old plain HMAC).

Anyone who reaches the store's port reads the job's salt and the front's public CURVE key (both public keys),
and tries tokens until one derives that key. Each try costs one derivation of the job key: before, one
HMAC-SHA256 of the token; now auth.stretch (scrypt with ddptop's parameters and the job's salt). This times both in the same process, on
one core, and prints the ratio. A GPU or many cores speed up both; scrypt's 16 MiB per guess limits how far.

    .venv/bin/python benchmarks/guess_cost.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ddptop.control.auth import PROTOCOL, SCRYPT_N, SCRYPT_P, SCRYPT_R, new_salt, stretch  # noqa: E402


def rate(guess, seconds: float) -> tuple[float, int]:
    """Guesses per second over at least `seconds` (and at least 3 guesses)."""
    count, start = 0, time.perf_counter()
    while count < 3 or time.perf_counter() - start < seconds:
        guess(f"candidate-{count}")
        count += 1
    return count / (time.perf_counter() - start), count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="time each method at least this long")
    args = parser.parse_args()
    salt = new_salt()
    old, n_old = rate(lambda t: hmac.new(t.encode(), PROTOCOL + b"\0namespace", hashlib.sha256).digest(),
                      args.seconds)
    new, n_new = rate(lambda t: stretch(t, salt), args.seconds)
    print(f"plain HMAC-SHA256 (before):  {old:12,.0f} guesses/s  ({1e6 / old:8.2f} µs each, {n_old} timed)")
    print(f"scrypt N={SCRYPT_N} r={SCRYPT_R} p={SCRYPT_P} (now): {new:12,.1f} guesses/s  ({1e3 / new:8.2f} ms each, "
          f"{n_new} timed)")
    print(f"each guess costs {old / new:,.0f} times more; a 16-byte random token (2^128) stays out of reach either way,"
          f" a random 8-character printable one takes {95 ** 8 / new / 86400 / 365:,.0f} core-years instead of "
          f"{95 ** 8 / old / 86400 / 365:,.2f}")


if __name__ == "__main__":
    main()
