"""noded's fault sources (issue 12)."""
