"""Simulators (top floor): the BMC (:mod:`faultmesh.sims.bmc`) and the HCCS fabric (:mod:`faultmesh.sims.fabric`). They
may import anything; nothing below the top floor imports them."""
