"""clusterd."""
