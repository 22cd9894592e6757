"""faultmesh's own fault knowledge, shipped as package data (``fault_meanings.json``).

Read through :mod:`faultmesh.faultinfo`; nothing here is imported for its code.
"""
