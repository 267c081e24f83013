"""Which XID errors mean a GPU is unhealthy.

An XID is the NVIDIA driver's report of a GPU error (``nvmlEventTypeXidCriticalError``,
its number in the event's data). NVIDIA's catalog, "XID Errors"
(https://docs.nvidia.com/deploy/xid-errors/), says for each what it means and who
is to blame: some are *application* errors (the program that ran into them is killed,
the GPU itself is fine), others a failure of the GPU, its memory, its links or its
firmware, after which the GPU must be reset, the driver reloaded or the machine
serviced.

The rule, as NVIDIA's device plugin applies it (``internal/rm/health.go``): an XID
marks the GPU unhealthy unless it is on the ignore list. The default ignore list is
the device plugin's: 13, 31, 43, 45, 68 and 109, the catalog's application errors.
``--xid-ignore`` replaces it, and ``--xid-critical`` takes XIDs off it (so an operator
who has seen XID 43 precede a hang can make it count). An XID nobody listed is
critical: a number the catalog gained after this table was written is more likely a
new hardware or firmware failure than a new way for a program to crash.

XID 79, "GPU has fallen off the bus", is the GPU *lost*: NVML cannot reach it until a
reset or a reboot.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The device plugin's default ignore list: application errors, the GPU stays usable.
DEFAULT_IGNORED: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
#: The GPU has fallen off the bus.
LOST = 79
#: An XID number is a 64-bit event datum; anything outside this is garbage.
MAX_XID = 1 << 16

#: What the catalog calls the XIDs an operator meets most, for the reasons the agent
#: publishes (the number alone is in every reason; this is only its name).
NAMES: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    32: "invalid or corrupted push buffer stream",
    38: "driver firmware error",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapping recording failure",
    68: "video processor exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}


@dataclass(frozen=True, slots=True)
class XidPolicy:
    """The ignore list in force (see the module)."""

    ignored: frozenset[int] = DEFAULT_IGNORED

    @classmethod
    def configured(cls, ignore: str | None = None, critical: str | None = None) -> XidPolicy:
        """From the flags: ``ignore`` replaces the default list (``""``: ignore
        nothing), ``critical`` takes XIDs off whichever list is in force. Raises
        ValueError naming a value that is not an XID number."""
        ignored = DEFAULT_IGNORED if ignore is None else parse_xids(ignore, "--xid-ignore")
        return cls(ignored - parse_xids(critical or "", "--xid-critical"))

    def critical(self, xid: int) -> bool:
        """True: the GPU is unhealthy after this XID."""
        return xid not in self.ignored


def parse_xids(text: str, flag: str) -> frozenset[int]:
    """``"13, 31,43"`` as XID numbers; ValueError naming the flag and the bad value."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isascii() or not part.isdigit() or not 0 < int(part) < MAX_XID:
            raise ValueError(f"{flag}: {part[:20]!r} is not an XID number (1..{MAX_XID - 1})")
        out.add(int(part))
    return frozenset(out)


def describe(xid: int) -> str:
    """``XID 79 (GPU has fallen off the bus)``; a number the table does not name is
    still given (and bounded: NVML's event datum is whatever the driver sent)."""
    if not 0 <= xid < 1 << 64:
        return "XID (out of range)"
    name = NAMES.get(xid)
    return f"XID {xid} ({name})" if name else f"XID {xid}"
