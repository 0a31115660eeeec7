"""Which transport NCCL used (`env.nccl.transport`), read from its own INFO lines.

At NCCL_DEBUG=INFO (with NCCL_DEBUG_SUBSYS including INIT, as launch.commands sets for a cuda
run unless config `env` says otherwise) every rank prints, when it connects a channel to a
peer, one line naming the transport (formats of NCCL's src/transport/net.cc, p2p.cc, shm.cc):

    NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA
    NCCL INFO Channel 01/0 : 1[1] -> 9[1] [send] via NET/IB/1(9)/GDRDMA/Shared
    NCCL INFO Channel 00/0 : 0[0] -> 1[1] [receive] via NET/Socket/0
    NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
    NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC
    NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct

A 2-node result that fell back to NET/Socket instead of NET/IB (no rdma-core in the image, a
wrong NCCL_IB_HCA) is slow for a reason no other figure shows. The supervisor sees every
rank's output (launch.supervise) and feeds the lines here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: "via <what>" of a channel line; <what> ends at the line's end or a space
_VIA = re.compile(r"NCCL INFO Channel \d+(?:/\d+)? : .* via (\S+(?: pointer)?)")
#: order in the answer: between nodes first (what a multi-node run's speed hangs on)
_ORDER = ("NET", "P2P", "SHM")


def kind(via: str) -> str:
    """One transport as the record names it: NET/<network>[/GDRDMA] (IB, Socket, a plug-in's
    name), P2P/<mode> (CUMEM, IPC, MNNVL, direct pointer, indirect), SHM."""
    parts = via.split("/")
    if parts[0] == "NET" and len(parts) > 1:
        return "NET/" + parts[1] + ("/GDRDMA" if "GDRDMA" in parts else "")
    if parts[0] == "P2P" and len(parts) > 1:
        return "P2P/" + parts[1]
    return parts[0]


def transport(lines: Iterable[str]) -> str | None:
    """Every transport NCCL's channel lines name, between nodes first, joined by ", " (one
    string, e.g. "NET/IB/GDRDMA, P2P/CUMEM"); None where no line names one (no NCCL, one
    rank, or NCCL_DEBUG below INFO)."""
    seen = Transports()
    for line in lines:
        seen.see(line)
    return seen.answer


class Transports:
    """The transports of a run's channel lines, gathered as its output streams past."""

    def __init__(self) -> None:
        self.found: set[str] = set()

    def see(self, line: str) -> None:
        if " via " in line and (m := _VIA.search(line)):
            self.found.add(kind(m.group(1)))

    @property
    def answer(self) -> str | None:
        if not self.found:
            return None
        rank = {name: i for i, name in enumerate(_ORDER)}
        order = sorted(self.found, key=lambda k: (rank.get(k.split("/")[0], len(_ORDER)), k))
        return ", ".join(order)
