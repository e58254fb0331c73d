"""The pod set fingerprint an NRT carries (`nodeTopologyPodsFingerprint`), which the admission
controller's ledger recomputes from the pods it sees.

Public API: `pod_set_fingerprint(pods: Iterable[tuple[namespace, name]]) -> str` ("pfp0v001<16 hex>"),
`counted_set(pods, fingerprint, toggles)` (which set, near `pods`, a fingerprint is of),
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


def counted_set(pods: Collection[Pod], fingerprint: str, toggles: Collection[Pod]) -> frozenset[Pod] | None:
    """The set `fingerprint` is of: `pods` with the fewest of `toggles` flipped (a toggle in `pods`
    taken out, one not in it put in); None when no flip tried matches.  An agent publishes the
    fingerprint of the pods it has pinned so far, which lags the pods the controller sees bound to its
    node by the newest few, or leads them by a pod whose status the controller has not seen yet: those
    are the toggles, and a match names exactly the set its NRT's figures were computed over.  At most
    `MAX_SUSPECT_SETS` flips are tried (a 64-bit hash: a false match is out of reach at that count)."""
    base = {pod: _pod_hash(pod) for pod in pods}
    flips = list(dict.fromkeys(toggles))
    tried = 0
    for size in range(len(flips) + 1):
        for flipped in combinations(flips, size):
            if tried >= MAX_SUSPECT_SETS:
                return None
            tried += 1
            counted = set(base).symmetric_difference(flipped)
            if _of_hashes(base[pod] if pod in base else _pod_hash(pod) for pod in counted) == fingerprint:
                return frozenset(counted)
    return None
