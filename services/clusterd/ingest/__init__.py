"""The agent stream: ingest of noded/deviced faults and state, control messages down."""
