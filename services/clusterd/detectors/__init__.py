"""clusterd's detectors and their edges to the pure FD-OL library (:mod:`fdol`)."""
