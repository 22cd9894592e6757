"""fdol."""
