"""Simulators (top floor): the HCCS fabric (:mod:`faultmesh.sims.fabric`). They may import anything;
nothing below the top floor imports them."""
