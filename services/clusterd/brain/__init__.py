"""The cluster brain: jobs, recovery decisions and the upstream Recover / Fault / Job / Config /
TrainingDataTrace services (issue 7). The ClusterD component is
:class:`clusterd.brain.component.BrainComponent`."""
