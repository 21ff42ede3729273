#!/usr/bin/env python3
"""A userspace stand-in for `tc qdisc ... netem delay D jitter J loss P` (scripts/multihost.sh).

Used where the kernel has no sch_netem (this project's VMs: CONFIG_NET_SCH_NETEM is not set). An
nftables rule sends a namespace's outgoing packets to NFQUEUE `--queue`; this process, started in that
namespace, gives each packet a verdict: dropped with probability `--loss`, otherwise accepted after
`--delay` +- `--jitter` (uniform). Packets keep their order (a packet is never released before the one
queued ahead of it), like netem with a rate; plain netem with jitter may reorder.
Speaks the nfnetlink_queue protocol directly (no libnetfilter_queue). Stops on SIGTERM/SIGINT; the
nftables rule must be removed first or the namespace's traffic stops (multihost.sh deletes the
namespace). Prints one line when bound, and the counts when it stops.
"""
import argparse
import heapq
import random
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NF_DROP, NF_ACCEPT = 0, 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2


def attr(kind, payload):
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * ((4 - n % 4) % 4)


class Queue:
    def __init__(self, num):
        self.num = num
        self.seq = 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE (root)
        self.sock.bind((0, 0))
        self.config(attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, 0)))
        self.config(attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)) +
                    attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", 1 << 16)))

    def send(self, msg_type, payload, flags=NLM_F_REQUEST):
        self.seq += 1
        body = struct.pack("!BBH", socket.AF_UNSPEC, 0, self.num) + payload  # nfgenmsg, res_id big-endian
        self.sock.send(struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags,
                                   self.seq, 0) + body)

    def config(self, payload):
        self.send(NFQNL_MSG_CONFIG, payload, NLM_F_REQUEST | NLM_F_ACK)
        data = self.sock.recv(65536)
        _, kind, _, _, _ = struct.unpack_from("=IHHII", data)
        if kind == NLMSG_ERROR:
            err = struct.unpack_from("=i", data, 16)[0]
            if err != 0:
                sys.exit(f"nfq_netem: configuring queue {self.num} failed: errno {-err}")

    def verdict(self, packet_id, v):
        self.send(NFQNL_MSG_VERDICT, attr(NFQA_VERDICT_HDR, struct.pack("!II", v, packet_id)))

    def packets(self, data):
        """The packet ids of the NFQNL_MSG_PACKET messages in one datagram."""
        off = 0
        while off + 16 <= len(data):
            length, kind, _, _, _ = struct.unpack_from("=IHHII", data, off)
            if length < 16:
                break
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                a = off + 20  # nlmsghdr + nfgenmsg
                while a + 4 <= off + length:
                    alen, atype = struct.unpack_from("=HH", data, a)
                    if alen < 4:
                        break
                    if atype & 0x3FFF == NFQA_PACKET_HDR:
                        yield struct.unpack_from("!I", data, a + 4)[0]
                    a += (alen + 3) & ~3
            off += (length + 3) & ~3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queue", type=int, required=True)
    ap.add_argument("--delay", type=float, default=0.0, help="seconds")
    ap.add_argument("--jitter", type=float, default=0.0, help="seconds, uniform in [-J, J]")
    ap.add_argument("--loss", type=float, default=0.0, help="drop probability, 0..1")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    q = Queue(a.queue)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    print(f"nfq_netem: queue {a.queue}: delay {a.delay * 1e3:g} ms jitter {a.jitter * 1e3:g} ms "
          f"loss {a.loss * 100:g}%", flush=True)
    held = []  # (release time, order, packet id)
    last_release = 0.0
    order = 0
    seen = dropped = 0
    while not stop:
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, _, pid = heapq.heappop(held)
            q.verdict(pid, NF_ACCEPT)
        wait = max(0.0, held[0][0] - now) if held else 0.5
        try:
            ready, _, _ = select.select([q.sock], [], [], wait)
        except InterruptedError:
            continue
        if not ready:
            continue
        try:
            data = q.sock.recv(1 << 20)
        except OSError:  # ENOBUFS: the kernel dropped messages; their packets time out as losses
            continue
        now = time.monotonic()
        for pid in q.packets(data):
            seen += 1
            if a.loss > 0 and rng.random() < a.loss:
                dropped += 1
                q.verdict(pid, NF_DROP)
                continue
            if a.delay <= 0 and a.jitter <= 0:
                q.verdict(pid, NF_ACCEPT)
                continue
            t = now + max(0.0, a.delay + rng.uniform(-a.jitter, a.jitter))
            last_release = max(last_release, t)  # keep the order
            order += 1
            heapq.heappush(held, (last_release, order, pid))
    for _, _, pid in held:
        q.verdict(pid, NF_ACCEPT)
    print(f"nfq_netem: queue {a.queue}: {seen} packets, {dropped} dropped", flush=True)


if __name__ == "__main__":
    main()
