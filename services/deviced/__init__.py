"""deviced."""
