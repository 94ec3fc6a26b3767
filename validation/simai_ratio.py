"""SimAI-Analytical's size-efficiency tables (fraction of peak bus bandwidth by message size).

Source: SimAI 1.7 (aliyun/SimAI commit cef83f9), ``astra-sim-alibabacloud/inputs/ratio/nic_ratio.csv``,
``nvlink_ratio.csv`` and ``ata_ratio.csv``; the same files are in ../shared/data/simai/ (a test checks these
figures against them). Shipped as figures so that the compatibility mode needs no files at run time.

Each table is a tuple of rows ``(size_bytes, values)``; ``values`` has one entry per CSV column after
``Size``: ``1 Node(NVLinkx), 2Node-16GPU, 4Node-32GPU, 8Node-64GPU, 16Node-128GPU, 32Node-256GPU,
64Node-512GPU, 128Node-1024GPU, Multi 16, Multi 32, Muiti 64, Multi (NIC)``. ``None`` is an empty cell, which
SimAI reads as 1 (simai-notes section 3.2).
"""

COLUMNS = ("1 Node(NVLinkx)", "2Node-16GPU(NIC )", "4Node-32GPU(NIC)", "8Node-64GPU(NIC)", "16Node-128GPU(NIC)",
           "32Node-256GPU(NIC)", "64Node-512GPU(NIC)", "128Node-1024GPU(NIC)", "Multi 16", "Multi 32", "Muiti 64",
           "Multi (NIC)")
"""CSV headers of the value columns, as spelled in the SimAI files."""
MULTI_COLUMN = 8
"""Index of the ``Multi 16`` column: SimAI's "col 9" counting the Size column as 0 (simai-notes 3.2)."""

NIC_RATIO = (  # bytes, fraction of peak per column
    (16777216, (0.45, 0.32, 0.24, 0.13, 0.05, 0.044, 0.021, 0.0087, 0.86, 0.86, 0.77, None)),
    (33554432, (0.55, 0.47, 0.38, 0.24, 0.11, 0.052, 0.042, 0.021225, 0.92, 0.9, 0.8, None)),
    (67108864, (0.65, 0.5, 0.53, 0.39, 0.21, 0.106, 0.051, 0.04405, 0.94, 0.91, 0.83, None)),
    (134217728, (0.69, 0.67, 0.67, 0.54, 0.38, 0.205, 0.107, 0.0533, 0.94, 0.92, 0.87, None)),
    (268435456, (0.73, 0.85, 0.77, 0.69, 0.57, 0.387, 0.209, 0.1027, 0.94, 0.93, 0.91, 0.9)),
    (536870912, (0.76, 0.89, 0.85, 0.78, 0.73, 0.562, 0.384, 0.1902, 0.95, 0.94, 0.93, 0.95)),
    (1073741824, (0.77, 0.92, 0.93, 0.9, 0.76, 0.74, 0.563, 0.314575, 0.96, 0.95, 0.94, 0.95)),
    (2147483648, (0.78, 0.94, 0.94, 0.94, 0.92, 0.758, 0.745, 0.553525, 0.96, 0.96, 0.95, 0.95)),
    (4294967296, (0.79, 0.95, 0.95, 0.95, 0.95, 0.923, 0.755, 0.740175, 0.96, 0.96, 0.95, 0.95)),
    (8589934592, (0.8, 0.95, 0.96, 0.96, 0.96, 0.953, 0.914, 0.7648, 0.96, 0.96, 0.96, 0.95)),
    (17179869184, (0.81, 0.96, 0.96, 0.96, 0.96, 0.957, 0.958, 0.919175, 0.96, 0.96, 0.96, 0.95)),
)
NVLINK_RATIO = (  # bytes, fraction of peak per column
    (16777216, (0.45, 0.55, 0.34, 0.16, 0.08, None, None, None, 0.86, 0.86, 0.77, None)),
    (33554432, (0.55, 0.68, 0.6, 0.34, 0.16, None, None, None, 0.92, 0.9, 0.8, None)),
    (67108864, (0.65, 0.74, 0.71, 0.62, 0.33, None, None, None, 0.94, 0.91, 0.83, None)),
    (134217728, (0.69, 0.8, 0.74, 0.7, 0.65, None, None, None, 0.94, 0.92, 0.87, None)),
    (268435456, (0.73, 0.84, 0.79, 0.78, 0.72, None, None, None, 0.94, 0.93, 0.91, 0.9)),
    (536870912, (0.76, 0.86, 0.86, 0.82, 0.75, None, None, None, 0.95, 0.94, 0.93, 0.95)),
    (1073741824, (0.77, 0.87, 0.87, 0.86, 0.83, None, None, None, 0.96, 0.95, 0.94, 0.95)),
    (2147483648, (0.78, 0.87, 0.87, 0.87, 0.86, None, None, None, 0.96, 0.96, 0.95, 0.95)),
    (4294967296, (0.79, 0.88, 0.88, 0.88, 0.87, None, None, None, 0.96, 0.96, 0.95, 0.95)),
    (8589934592, (0.8, 0.88, 0.88, 0.88, 0.88, None, None, None, 0.96, 0.96, 0.96, 0.95)),
    (17179869184, (0.81, 0.88, 0.88, 0.88, 0.88, None, None, None, 0.96, 0.96, 0.96, 0.95)),
)
ATA_RATIO = (  # bytes, fraction of peak per column
    (16777216, (0.44, 0.52, 0.67, 0.64, 0.62, None, None, None, 0.86, 0.86, 0.77, None)),
    (33554432, (0.51, 0.63, 0.68, 0.67, 0.66, None, None, None, 0.92, 0.9, 0.8, None)),
    (67108864, (0.6, 0.72, 0.83, 0.82, 0.66, None, None, None, 0.94, 0.91, 0.83, None)),
    (134217728, (0.65, 0.76, 0.9, 0.85, 0.72, None, None, None, 0.94, 0.92, 0.87, None)),
    (268435456, (0.7, 0.79, 0.92, 0.87, 0.75, None, None, None, 0.94, 0.93, 0.91, 0.9)),
    (536870912, (0.71, 0.8, 0.94, 0.89, 0.81, None, None, None, 0.95, 0.94, 0.93, 0.95)),
    (1073741824, (0.74, 0.81, 0.94, 0.92, 0.85, None, None, None, 0.96, 0.95, 0.94, 0.95)),
    (2147483648, (0.76, 0.81, 0.95, 0.93, 0.88, None, None, None, 0.96, 0.96, 0.95, 0.95)),
    (4294967296, (0.77, 0.8, 0.95, 0.94, 0.89, None, None, None, 0.96, 0.96, 0.95, 0.95)),
    (8589934592, (0.78, 0.8, 0.95, 0.94, 0.9, None, None, None, 0.96, 0.96, 0.96, 0.95)),
    (17179869184, (0.78, 0.8, 0.95, 0.94, 0.9, None, None, None, 0.96, 0.96, 0.96, 0.95)),
)
