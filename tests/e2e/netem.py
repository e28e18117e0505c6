"""A slow, lossy link where the kernel has no `netem`: every packet the network namespace sends is held back a
fixed delay and a share of them dropped, as `tc qdisc add dev eth0 root netem delay D loss P` on each of its
interfaces would (egress only; loopback untouched).

This kernel lacks CONFIG_NET_SCH_NETEM and nftables' `queue`, but has iptables' NFQUEUE target: a rule
(`iptables-legacy ... -j NFQUEUE --queue-bypass`) hands each outgoing packet to this process over netlink
(NFNETLINK, the queue subsystem), which answers each with a verdict: DROP at once for the lost share, ACCEPT once
the delay has passed for the rest. Only the packets' metadata are copied up, never their bytes.

Run inside the namespace, as root: `nsenter -t PID -n python -m tests.e2e.netem --delay-ms 200 --loss 5`. It
prints `ready` once bound, then adds the rule; on SIGTERM it removes the rule, lets every held packet go, and
exits. Should it die, `--queue-bypass` passes the packets on undelayed.
"""

from __future__ import annotations

import argparse
import collections
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
MSG_PACKET, MSG_VERDICT, MSG_CONFIG = 0, 1, 2
CFG_CMD, CFG_PARAMS, CFG_QUEUE_MAXLEN, CFG_MASK, CFG_FLAGS = 1, 2, 3, 4, 5
CMD_BIND, CMD_UNBIND = 1, 2
COPY_META = 1
F_FAIL_OPEN = 1  # a full queue passes packets on rather than dropping them
PACKET_HDR, VERDICT_HDR = 1, 2
NF_DROP, NF_ACCEPT = 0, 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
SOL_NETLINK, NETLINK_NO_ENOBUFS = 270, 5
RULE = ["OUTPUT", "!", "-o", "lo", "-j", "NFQUEUE", "--queue-bypass"]


def _attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _message(msg: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST, family: int = socket.AF_UNSPEC) -> bytes:
    """A netfilter-queue netlink message: nlmsghdr, nfgenmsg (family, version 0, queue number big-endian), attrs."""
    body = struct.pack("=BBH", family, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, 0, 0) + body


def _attrs(raw: bytes) -> dict[int, bytes]:
    out, at = {}, 0
    while at + 4 <= len(raw):
        size, kind = struct.unpack_from("=HH", raw, at)
        if size < 4:
            break
        out[kind & 0x3FFF] = raw[at + 4:at + size]
        at += (size + 3) & ~3
    return out


class Queue:
    """One bound netfilter queue: packets in (`packet_ids`), verdicts out (`verdict`)."""

    def __init__(self, number: int):
        self.number = number
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))
        self._config(_attr(CFG_CMD, struct.pack("!BBH", CMD_BIND, 0, socket.AF_INET)))
        self._config(_attr(CFG_PARAMS, struct.pack("!IB", 0xFFFF, COPY_META)) + _attr(CFG_QUEUE_MAXLEN,
                     struct.pack("!I", 65536)) + _attr(CFG_FLAGS, struct.pack("!I", F_FAIL_OPEN))
                     + _attr(CFG_MASK, struct.pack("!I", F_FAIL_OPEN)))

    def _config(self, attrs: bytes) -> None:
        self.sock.send(_message(MSG_CONFIG, self.number, attrs, NLM_F_REQUEST | NLM_F_ACK))
        reply = self.sock.recv(65536)
        kind, = struct.unpack_from("=H", reply, 4)
        code, = struct.unpack_from("=i", reply, 16)
        if kind == NLMSG_ERROR and code != 0:
            raise OSError(-code, f"netfilter queue {self.number} config refused")

    def packet_ids(self) -> list[int]:
        """The IDs of the packets in one read of the socket."""
        data, ids, at = self.sock.recv(1 << 20), [], 0
        while at + 16 <= len(data):
            size, kind = struct.unpack_from("=IH", data, at)
            if size < 16:
                break
            if kind == (NFNL_SUBSYS_QUEUE << 8) | MSG_PACKET:
                hdr = _attrs(data[at + 20:at + size]).get(PACKET_HDR)
                if hdr:
                    ids.append(struct.unpack_from("!I", hdr)[0])
            at += (size + 3) & ~3
        return ids

    def verdict(self, packet_id: int, verdict: int) -> None:
        self.sock.send(_message(MSG_VERDICT, self.number, _attr(VERDICT_HDR, struct.pack("!II", verdict, packet_id))))


def iptables(action: str, queue: int) -> None:
    rule = [*RULE, "--queue-num", str(queue)]
    subprocess.run(["iptables-legacy", "-w", action, *rule], check=True, capture_output=True, timeout=30)


def serve(queue: Queue, delay_s: float, loss: float, stop: list[bool], unhook: Callable[[], None]) -> dict[str, int]:
    """Hold each packet `delay_s`, dropping a `loss` share at once, until `stop[0]`; then `unhook()` (no packet
    comes any more), let every held packet go at once, and return the packets delayed and dropped."""
    held: collections.deque[tuple[float, int]] = collections.deque()  # (release time, id), in arrival order
    counts = {"delayed": 0, "dropped": 0}
    quiet_since = None
    while True:
        if stop[0] and quiet_since is None:
            unhook()
            delay_s, loss, quiet_since = 0.0, 0.0, time.monotonic()
        now = time.monotonic()
        while held and held[0][0] <= now:
            queue.verdict(held.popleft()[1], NF_ACCEPT)
        wait = min(held[0][0] - now, 0.05) if held else 0.05
        if select.select([queue.sock], [], [], max(wait, 0))[0]:
            release = time.monotonic() + delay_s
            for packet_id in queue.packet_ids():
                if random.random() < loss:
                    queue.verdict(packet_id, NF_DROP)
                    counts["dropped"] += 1
                else:
                    held.append((release, packet_id))
                    counts["delayed"] += 1
        elif quiet_since is not None and not held and time.monotonic() - quiet_since > 0.2:
            return counts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay-ms", type=float, required=True)
    ap.add_argument("--loss", type=float, default=0.0, help="percent of packets dropped")
    ap.add_argument("--queue", type=int, default=7)
    args = ap.parse_args(argv)
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    queue = Queue(args.queue)
    iptables("-A", args.queue)
    print("ready", flush=True)
    counts = serve(queue, args.delay_ms / 1000, args.loss / 100, stop, lambda: iptables("-D", args.queue))
    print(f"delayed {counts['delayed']} dropped {counts['dropped']}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
