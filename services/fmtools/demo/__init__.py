"""The faultmesh demo (``make demo`` = ``python -m fmtools.demo``) and the local stack of
``faultmesh up``.

- :mod:`fmtools.demo.procs`: child processes with one log folder, stopped by PID;
- :mod:`fmtools.demo.stack`: clusterd + per server bmc-sim, noded, deviced on 127.0.0.1;
- :mod:`fmtools.demo.watch`: polls clusterd's fault center for detections;
- :mod:`fmtools.demo.scenario`: the scripted faults and how each is judged;
- :mod:`fmtools.demo.report`: timestamped lines and the summary table;
- the training job is :mod:`faultmesh.profiler.example_job` (a real 4-process PyTorch CPU gloo
  job instrumented with :mod:`faultmesh.profiler`), slowed at run time through its ``--slow-file``.
"""
