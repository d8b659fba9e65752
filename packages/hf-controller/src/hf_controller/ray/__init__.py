"""The Ray backend: placement-group resource pools and actor-based worker groups."""
