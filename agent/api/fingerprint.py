"""The pod set fingerprint an NRT carries (`nodeTopologyPodsFingerprint`), which the admission
controller's ledger recomputes from the pods it sees.

Public API: `pod_set_fingerprint(pods: Iterable[tuple[namespace, name]]) -> str` ("pfp0v001<16 hex>"),
`FINGERPRINT_PREFIX`.
"""

from __future__ import annotations

from collections.abc import Iterable

from xxhash import xxh64_intdigest

# Format (k8stopologyawareschedwg/podfingerprint, "pfp0" + "v001"): each pod hashes to
# XXH64(name, seed=XXH64(namespace, seed=0)); the hashes are sorted as unsigned integers, written
# little-endian 8 bytes each, and that byte string hashed with XXH64 (seed 0); the digest is printed
# big-endian as 16 hex digits after the prefix.  XXH64 is the `xxhash` package's (the reference C
# implementation).
FINGERPRINT_PREFIX = "pfp0v001"


def pod_set_fingerprint(pods: Iterable[tuple[str, str]]) -> str:
    """The podfingerprint of a set of pods given as (namespace, name); order does not matter."""
    hashes = sorted(
        xxh64_intdigest(name.encode(), xxh64_intdigest(namespace.encode())) for namespace, name in pods
    )
    digest = xxh64_intdigest(b"".join(h.to_bytes(8, "little") for h in hashes))
    return FINGERPRINT_PREFIX + digest.to_bytes(8, "big").hex()
