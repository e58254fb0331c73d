"""The pinning engine both node agents share: exclusive CPUs chosen, recorded and enforced on one node."""
