"""ClusterD gRPC services of the core: the server (limits, TLS) and PubFault."""
