"""ClusterD HTTP read API (routes of the core; components add their own)."""
