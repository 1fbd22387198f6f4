"""Take from the graded code the powers root has beyond reading and writing files (Linux).

A judge running as root (a Gradescope container, an instructor's `sudo`) starts its workers as
root. Landlock and seccomp hold for root too, but root's capabilities reach past files: loading
kernel modules, rebooting, raw I/O, mounts, changing clocks, owners and network settings. A
worker drops every capability but the two that let it open what Landlock allows whoever owns it
(CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH: a checkout owned by another user), for good: from the
bounding set too where it may, so no program it runs gets them back. For an ordinary user there
is nothing to drop.
"""

from __future__ import annotations

import ctypes
from typing import Optional

_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2
KEPT = (1 << _CAP_DAC_OVERRIDE) | (1 << _CAP_DAC_READ_SEARCH)
_CAPABILITY_V3 = 0x20080522


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def effective() -> int:
    """This process's effective capabilities, as a bit mask (0 where /proc does not say)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 40


def drop() -> Optional[str]:
    """Keep only `KEPT` (of those this process has), in every set and the bounding set. Returns
    None once done (or where there was nothing to drop), or why it could not be."""
    if effective() & ~KEPT == 0:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(_last_cap() + 1):
        if not (KEPT >> cap) & 1:
            # needs CAP_SETPCAP, which a container may lack: then no_new_privs (set by the
            # sandbox and the seccomp filter) alone keeps a program it runs from regaining them
            libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    have = effective()
    data = (_Data * 2)()
    for i in range(2):  # 64 capability bits in two 32-bit words
        word = (have & KEPT) >> (32 * i) & 0xFFFFFFFF
        data[i].effective = data[i].permitted = word
    if libc.capset(ctypes.byref(_Header(_CAPABILITY_V3, 0)), data) != 0:
        return f"capset failed (errno {ctypes.get_errno()})"
    if effective() & ~KEPT:
        return "capabilities remain after capset"
    return None
