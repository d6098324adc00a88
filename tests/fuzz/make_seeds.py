#!/usr/bin/env python3
"""Writes the seed corpora (corpus/<target>/) from the layouts in
core/wire/wire.h: a few valid messages per target. Rerun after a wire change."""
import os
import struct

HELLO_MAGIC = b"\xffrdmashH"
ACK_MAGIC = b"\xffrdmashA"
SHM, VERBS = 1, 2
DATA, SWITCH, PLAIN, CLOSE, PING, PARAMS, URGENT = 1, 2, 3, 4, 5, 6, 16


def hello(transports):
    return HELLO_MAGIC + struct.pack("<HHI", 1, 0, transports) + bytes(range(16)) + b"R" * 16 + bytes(16)


def ack(transport, ring, fallback=0):
    # fallback: why a negative Ack declined (1 policy, 2 setup failed), then reserved[15]
    return ACK_MAGIC + struct.pack("<HHI", 1, transport, ring) + bytes(16) + b"T" * 16 + bytes([fallback]) + bytes(15)


def frame(kind, payload=b""):
    return struct.pack("<IHH", len(payload), kind, 0) + payload


def params(ring=4096):
    # verbs::Params: qpn psn gid[16] addr rkey ring_size lid mtu reserved[5]
    return frame(PARAMS, struct.pack("<II16sQIIHB5s", 17, 1, bytes(16), 0x1000, 5, ring, 1, 3, bytes(5)))


def data(b):
    return frame(DATA, b)


seeds = {
    "fuzz_server": {  # style byte, then the client's bytes
        "hello_shm": b"\x00" + hello(SHM) + data(b"ping") + frame(PLAIN) + b"raw after plain",
        "hello_verbs": b"\x03" + hello(VERBS) + params() + data(b"x" * 100) + frame(PING),
        "hello_switch": b"\x06" + hello(SHM) + frame(SWITCH),
        "hello_close": b"\x01" + hello(SHM | VERBS) + params() + frame(CLOSE, struct.pack("<Q", 4)),
        "hello_urgent": b"\x02" + hello(SHM) + frame(URGENT, struct.pack("<QB7s", 1, 33, bytes(7))),
        "plain_client": b"\x00GET / HTTP/1.0\r\n\r\n",
        "partial_magic": b"\x00\xffrdm",
    },
    "fuzz_client": {  # style byte, then the server's answer (nonce patched in)
        "ack_shm": b"\x00" + ack(SHM, 4096) + data(b"pong") + frame(PLAIN) + b"raw",
        "ack_none": b"\x02" + ack(0, 0) + b"raw bytes after a negative ack",
        "ack_none_setup_failed": b"\x00" + ack(0, 0, 2) + b"raw bytes after a negative ack",
        "ack_verbs": b"\x01" + ack(VERBS, 4096) + params() + frame(SWITCH),
        "ack_frames": b"\x04" + ack(SHM, 4096) + data(b"a") + frame(PING) + frame(CLOSE, struct.pack("<Q", 0)),
        "server_first": b"\x00+OK redis ready\r\n",
        "wrong_nonce": b"\x80" + ack(SHM, 4096),
    },
    "fuzz_wire": {
        "data_header": frame(DATA, b"abc"),
        "params_frame": params(),
        "hello": hello(SHM | VERBS),
        "ack": ack(SHM, 1 << 20),
    },
    "fuzz_ring": {  # ring size index, late placement, then ops (op, len[, cursor])
        "write_read": bytes([0, 0, 0, 3, 1, 2, 7, 0]),
        "wrap": bytes([1, 1, 0, 7, 1, 5, 0, 7, 2, 7, 6, 1, 7, 0]),
        "bad_tail": bytes([0, 0, 0, 1, 3, 0]) + struct.pack("<q", -1) + bytes([1, 4]),
        "bad_head": bytes([2, 0, 0, 9, 4, 0]) + struct.pack("<q", 1 << 40) + bytes([0, 9, 7, 0]),
        "nudge": bytes([0, 1, 0, 2, 5, 0, 1, 1, 0x12, 2, 8, 0]),
    },
}

here = os.path.dirname(os.path.abspath(__file__))
for target, files in seeds.items():
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name, blob in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(blob)
