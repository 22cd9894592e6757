"""noded's sinks: where its state goes besides the agent stream (the node-info ConfigMap)."""
