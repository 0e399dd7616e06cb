"""The memory a new allocation can take now (no JAX: the command line reads it before JAX is imported)."""

from __future__ import annotations

import os

__all__ = ["available_memory"]


def available_memory() -> int:
    """Bytes of memory available to a new allocation (Linux's MemAvailable; else the free pages)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 2**63
