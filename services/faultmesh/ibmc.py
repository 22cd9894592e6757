"""Huawei iBMC's device-type table: the byte an OEM alarm record names its component with (reference
noded.md §1, "Device-type byte -> string"). Core, so that both noded (:mod:`noded.bmc.oem`, which
decodes alarm records with it) and :mod:`faultmesh.faultinfo` (which decodes an alarm code's top
byte with it) read one table."""

from __future__ import annotations

DEVICE_TYPES: dict[int, str] = {
    0x00: "CPU", 0x01: "Memory", 0x02: "Disk", 0x03: "PSU", 0x04: "Fan", 0x05: "Disk BP",
    0x06: "RAID Card", 0x07: "UNKNOWN", 0x08: "PCIe Card", 0x09: "AMC", 0x0A: "HBA", 0x0B: "Mezz Card",
    0x0C: "UNKNOWN", 0x0D: "NIC", 0x0E: "Memory Board", 0x0F: "PCIe Riser", 0x10: "Mainboard",
    0x11: "LCD", 0x12: "Chassis", 0x13: "NCM", 0x14: "Switch Module", 0x15: "Storage Board",
    0x16: "Chassis BP", 0x17: "HMM/CMC", 0x18: "Fan BP", 0x19: "PSU BP", 0x1A: "BMC", 0x1B: "MMC/MM",
    0x1C: "Twin Node Backplane", 0x1D: "Base Plane", 0x1E: "Fabric Plane", 0x1F: "Switch Mezz",
    0x20: "LED", 0x21: "SD Card", 0x22: "Security Module", 0x23: "I/O Board", 0x24: "CPU Board",
    0x25: "RMC", 0x26: "PCIe Adapter", 0x27: "PCH", 0x28: "Cable", 0x29: "Port", 0x2A: "LSW",
    0x2B: "PHY", 0x2C: "System", 0x2D: "M.2 Transfer Card", 0x2E: "LED Board", 0x2F: "LPM",
    0x30: "PIC Card", 0x31: "Button", 0x32: "Expander", 0x33: "CPI", 0x34: "ACM", 0x35: "CIM",
    0x36: "PFM", 0x37: "KPAR", 0x38: "JC", 0x39: "SCM", 0x3A: "Minisas HD channel",
    0x3B: "SATA DOM channel", 0x3C: "GE channel", 0x3D: "XGE channel", 0x3E: "PCIe Switch",
    0x3F: "Interface Device", 0x40: "xPU Board", 0x41: "Disk BaseBoard", 0x42: "VGA Intf Card",
    0x43: "Pass-Through Card", 0x44: "Logical Driver", 0x45: "PCIe Retimer", 0x46: "PCIe Repeater",
    0x47: "SAS", 0x48: "Memory Channel", 0x49: "BMA", 0x4A: "LOM", 0x4B: "Signal Adapter Board",
    0x4C: "Horizontal Connection Board", 0x4D: "Node", 0x4E: "Asset Locate Board", 0x4F: "Unit",
    0x50: "RMM", 0x51: "Rack", 0x52: "BBU", 0x53: "OCP Card", 0x54: "Leakage Detection Card",
    0x55: "MESH Card", 0x56: "NPU", 0x57: "CIC Card", 0x58: "Expansion Module", 0x59: "Fan Module",
    0x5A: "AR Card", 0x5B: "Converge Board", 0x5C: "SoC Board", 0x5D: "ExpBoard",
    0xC0: "BCU", 0xC1: "EXU", 0xC2: "SEU", 0xC3: "IEU", 0xC4: "CLU",
}  # fmt: skip
UNKNOWN_TYPE = "UNKNOWN"
"""The name of a byte the table does not list."""
