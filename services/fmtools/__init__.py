"""fmtools: faultmesh's tools, the top floor (docs/architecture.md "What may import what").

The operator CLI (:mod:`fmtools.cli`, the ``faultmesh`` console command), the demo
(:mod:`fmtools.demo`), the BMC / fabric / RoCE simulators (:mod:`fmtools.sims`) and the TaskD / MindIO
stand-in (:mod:`fmtools.trainsim`). They may import anything; the core (:mod:`faultmesh`) and the
daemons never import them, so a daemon loads none of their code (issue 28).
"""
