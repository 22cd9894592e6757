"""BMC access for noded and the BMC simulator.

- :mod:`faultmesh.bmc.oem`: the Huawei iBMC "get current alarms" OEM command (netfn 0x30, cmd 0x94,
  IANA 0x0007DB): request encoding, reply parsing, paging, device-type table (reference noded.md §1).
- :mod:`faultmesh.bmc.sel`: System Event Log records and the (sensor type, event offset) -> fault
  code/level table used for BMCs without the OEM command.
- :mod:`faultmesh.bmc.client`: a thread-safe blocking wrapper around pyghmi's IPMI 2.0 lanplus client.
- :mod:`faultmesh.bmc.sim`: ``faultmesh bmc-sim``, a lanplus BMC on loopback built on pyghmi's server.
"""
