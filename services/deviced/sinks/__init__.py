"""Where deviced's state goes (issue 12): the agent state (:mod:`deviced.sinks.agentstate`), the
per-job reset-config files (:mod:`deviced.sinks.resetcfg`), the escalation state file
(:mod:`deviced.sinks.statefile`) and the reference device-info document
(:mod:`deviced.sinks.deviceinfo`). Each reads the engine; none changes it."""
