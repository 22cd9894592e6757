"""The faultmesh demo (``make demo`` = ``python -m faultmesh.demo``) and the local stack of
``faultmesh up``.

- :mod:`faultmesh.demo.procs`: child processes with one log folder, stopped by PID;
- :mod:`faultmesh.demo.stack`: clusterd + per server bmc-sim, noded, deviced on 127.0.0.1;
- :mod:`faultmesh.demo.watch`: polls clusterd's fault center for detections;
- :mod:`faultmesh.demo.scenario`: the scripted faults and how each is judged;
- :mod:`faultmesh.demo.report`: timestamped lines and the summary table;
- the training job is :mod:`faultmesh.profiler.example_job` (a real 4-process PyTorch CPU gloo
  job instrumented with :mod:`faultmesh.profiler`), slowed at run time through its ``--slow-file``.
"""
