"""BMC access for noded (the BMC source is :mod:`noded.sources.bmc`).

- :mod:`noded.bmc.oem`: the Huawei iBMC "get current alarms" OEM command (netfn 0x30, cmd 0x94,
  IANA 0x0007DB): request encoding, reply parsing, paging, device-type table (reference noded.md §1).
- :mod:`noded.bmc.sel`: System Event Log records and the (sensor type, event offset) -> fault
  code/level table used for BMCs without the OEM command.
- :mod:`noded.bmc.client`: a thread-safe blocking wrapper around pyghmi's IPMI 2.0 lanplus client.

The simulator ``faultmesh bmc-sim`` (top floor) is :mod:`fmtools.sims.bmc`; it uses these codecs.
"""
