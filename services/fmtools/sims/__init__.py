"""Simulators (top floor): the BMC (:mod:`fmtools.sims.bmc`) and the HCCS fabric (:mod:`fmtools.sims.fabric`). They
may import anything; nothing below the top floor imports them."""
