"""What this node's kubelet says: its pod-resources socket (CPU manager, devices held and offered)."""
