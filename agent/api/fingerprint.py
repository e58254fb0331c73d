"""The pod set fingerprint an NRT carries (`nodeTopologyPodsFingerprint`), which the admission
controller's ledger recomputes from the pods it sees.

Public API: `pod_set_fingerprint(pods: Iterable[tuple[namespace, name]]) -> str` ("pfp0v001<16 hex>"),
`missing_from(pods, fingerprint, suspects)` (which few of `pods` a fingerprint leaves out),
`FINGERPRINT_PREFIX`, `MAX_SUSPECT_SETS`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from itertools import combinations

from xxhash import xxh64_intdigest

# Format (k8stopologyawareschedwg/podfingerprint, "pfp0" + "v001"): each pod hashes to
# XXH64(name, seed=XXH64(namespace, seed=0)); the hashes are sorted as unsigned integers, written
# little-endian 8 bytes each, and that byte string hashed with XXH64 (seed 0); the digest is printed
# big-endian as 16 hex digits after the prefix.  XXH64 is the `xxhash` package's (the reference C
# implementation).
FINGERPRINT_PREFIX = "pfp0v001"


# The most subsets of the suspects `missing_from` tries (smallest first): 2**8, every subset of 8.
MAX_SUSPECT_SETS = 256

Pod = tuple[str, str]


def _pod_hash(pod: Pod) -> int:
    namespace, name = pod
    return xxh64_intdigest(name.encode(), xxh64_intdigest(namespace.encode()))


def _of_hashes(hashes: Iterable[int]) -> str:
    digest = xxh64_intdigest(b"".join(h.to_bytes(8, "little") for h in sorted(hashes)))
    return FINGERPRINT_PREFIX + digest.to_bytes(8, "big").hex()


def pod_set_fingerprint(pods: Iterable[Pod]) -> str:
    """The podfingerprint of a set of pods given as (namespace, name); order does not matter."""
    return _of_hashes(_pod_hash(pod) for pod in pods)


def missing_from(pods: Collection[Pod], fingerprint: str, suspects: Collection[Pod]) -> frozenset[Pod] | None:
    """The pods of `suspects` (a part of `pods`) whose absence from `pods` gives `fingerprint`, fewest
    first; None when no subset tried matches.  An agent that publishes the fingerprint of the pods it
    has pinned so far lags the pods bound to its node by the newest few: those are the suspects, and a
    match names exactly the set its NRT's figures were computed over.  At most `MAX_SUSPECT_SETS`
    subsets are tried (a 64-bit hash: a false match is out of reach at that count)."""
    hashes = {pod: _pod_hash(pod) for pod in pods}
    suspects = [pod for pod in dict.fromkeys(suspects) if pod in hashes]
    tried = 0
    for size in range(len(suspects) + 1):
        for gone in combinations(suspects, size):
            if tried >= MAX_SUSPECT_SETS:
                return None
            tried += 1
            out = set(gone)
            if _of_hashes(h for pod, h in hashes.items() if pod not in out) == fingerprint:
                return frozenset(out)
    return None
