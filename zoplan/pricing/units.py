"""Units of the profile's figures, by the suffix of their names (house rule 5): what a
pricing function multiplies a figure by to get seconds or bytes per second."""

from __future__ import annotations

US = 1e-6          # a figure in microseconds (`_us`)
NS = 1e-9          # a figure in nanoseconds (`_ns`, `_ns_per_elem`, `_ns_per_param`)
GBPS = 1e9         # a bandwidth in GB/s = 1e9 bytes/s, one direction (`_gbps`)
TFLOPS = 1e12      # a rate in TFLOP/s (`_tflops`)
GIB = 2**30        # a size in GiB (`_gib`)
MIB = 2**20
