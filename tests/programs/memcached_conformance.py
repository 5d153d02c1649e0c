#!/usr/bin/env python3
"""Sends one sequence of memcached commands, text and binary, to a server and prints what it
answered, with cas values renamed in order of appearance (c1, c2, ...) so that two servers'
transcripts compare equal when they behave alike. Version and stats answers are left out:
they name the server. Usage: memcached_conformance.py HOST:PORT"""
import re
import socket
import struct
import sys

HOST, PORT = sys.argv[1].rsplit(":", 1)
PORT = int(PORT)
SENTINEL = b"set __s 0 0 5 noreply\r\nMARKS\r\nget __s\r\n"
SENTINEL_END = b"VALUE __s 0 5\r\nMARKS\r\nEND\r\n"

cas_names = {}
cas_of = {}


def cas_name(v):
    if v not in cas_names:
        cas_names[v] = "c%d" % (len(cas_names) + 1)
    return cas_names[v]


def connect():
    s = socket.create_connection((HOST, PORT), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def text_exchange(s, cmd):
    cmd = re.sub(rb"\{cas:([^}]*)\}", lambda m: str(cas_of.get(m.group(1), 999999)).encode(), cmd)
    s.sendall(cmd + SENTINEL)
    buf = b""
    while not buf.endswith(SENTINEL_END):
        chunk = s.recv(65536)
        if not chunk:
            return buf.decode(errors="replace") + "<closed>"
        buf += chunk
    answer = buf[: -len(SENTINEL_END)]
    out = []
    for line in answer.split(b"\r\n"):
        m = re.match(rb"VALUE (\S+) (\d+) (\d+) (\d+)$", line)
        if m:
            cas_of[m.group(1)] = int(m.group(4))
            line = b"VALUE %s %s %s %s" % (m.group(1), m.group(2), m.group(3), cas_name(int(m.group(4))).encode())
        out.append(line.decode(errors="replace"))
    return "|".join(out)


TEXT = [
    b"get missing\r\n",
    b"set a 5 0 3\r\nabc\r\n",
    b"get a\r\n",
    b"gets a\r\n",
    b"set b 4294967295 0 0\r\n\r\n",
    b"get a b missing a\r\n",
    b"add a 0 0 1\r\nx\r\n",
    b"add c 0 0 1\r\nx\r\n",
    b"replace missing 0 0 1\r\nx\r\n",
    b"replace c 7 0 2\r\nyy\r\n",
    b"append c 0 0 2\r\nzz\r\n",
    b"prepend c 0 0 2\r\n<<\r\n",
    b"append missing 0 0 1\r\nx\r\n",
    b"gets c\r\n",
    b"cas c 0 0 3 {cas:c}\r\nnew\r\n",
    b"cas c 0 0 3 {cas:c}\r\nold\r\n",
    b"cas missing 0 0 1 1\r\nx\r\n",
    b"gets c\r\n",
    b"set n 0 0 2\r\n10\r\n",
    b"incr n 5\r\n",
    b"decr n 6\r\n",
    b"get n\r\n",
    b"decr n 100\r\n",
    b"set n 0 0 20\r\n18446744073709551615\r\n",
    b"incr n 2\r\n",
    b"incr a 1\r\n",
    b"incr missing 1\r\n",
    b"incr n abc\r\n",
    b"incr n\r\n",
    b"touch a 100\r\n",
    b"touch missing 100\r\n",
    b"touch a abc\r\n",
    b"gat 100 a missing\r\n",
    b"gats 0 a\r\n",
    b"delete a\r\n",
    b"delete a\r\n",
    b"delete c 0\r\n",
    b"delete c 5\r\n",
    b"set q 0 0 1 noreply\r\nq\r\n",
    b"add q 0 0 1 noreply\r\nq\r\n",
    b"incr n 1 noreply\r\n",
    b"delete q noreply\r\n",
    b"get q n\r\n",
    b"set e 0 -1 1\r\ne\r\n",
    b"get e\r\n",
    b"set k 0 0 2\r\nhello\r\n",
    b"set k 0 0 -1\r\n",
    b"set k x 0 1\r\nx\r\n",
    b"set k 0 0\r\n",
    b"set " + b"k" * 251 + b" 0 0 1\r\nx\r\n",
    b"get " + b"k" * 251 + b"\r\n",
    b"set " + b"k" * 250 + b" 0 0 1\r\nx\r\n",
    b"get " + b"k" * 250 + b"\r\n",
    b"set big 0 0 2000000\r\n" + b"x" * 2000000 + b"\r\n",
    b"get big\r\n",
    b"set big 0 0 2000000 noreply\r\n" + b"x" * 2000000 + b"\r\n",
    b"set grow 0 0 600000\r\n" + b"g" * 600000 + b"\r\n",
    b"append grow 0 0 600000\r\n" + b"h" * 600000 + b"\r\n",
    b"get grow\r\n",
    b"touch grow -1\r\n",
    b"get grow\r\n",
    b"set t32 0 4294967296 1\r\nx\r\n",
    b"set mid 0 0 100000\r\n" + bytes(range(256)) * 390 + b"x" * 160 + b"\r\n",
    b"get mid\r\n",
    b"bogus command\r\n",
    b"\r\n",
    b"get\r\n",
    b"stats noreply\r\n",
    b"stats nonsense\r\n",
    b"verbosity 1\r\n",
    b"verbosity 1 noreply\r\n",
    b"flush_all\r\n",
    b"get n mid\r\n",
    b"set after 0 0 1\r\n1\r\n",
    b"get after\r\n",
    b"flush_all noreply\r\n",
    b"get after\r\n",
    b"flush_all 0\r\n",
]

# Binary protocol.
REQ, RES = 0x80, 0x81
NOOP_OPAQUE = 0xFEEDFACE


def breq(op, key=b"", value=b"", extras=b"", cas=0, opaque=0):
    return struct.pack(">BBHBBHIIQ", REQ, op, len(key), len(extras), 0, 0, len(key) + len(extras) + len(value), opaque, cas) + extras + key + value


def bin_exchange(s, frames):
    s.sendall(frames + breq(0x0A, opaque=NOOP_OPAQUE))
    buf = b""
    out = []
    while True:
        while len(buf) < 24:
            chunk = s.recv(65536)
            if not chunk:
                return out + ["<closed>"]
            buf += chunk
        magic, op, klen, elen, _dt, status, blen, opaque, cas = struct.unpack(">BBHBBHIIQ", buf[:24])
        while len(buf) < 24 + blen:
            chunk = s.recv(65536)
            if not chunk:
                return out + ["<closed>"]
            buf += chunk
        body, buf = buf[24 : 24 + blen], buf[24 + blen :]
        if op == 0x0A and opaque == NOOP_OPAQUE:
            return out
        extras, key, value = body[:elen], body[elen : elen + klen], body[elen + klen :]
        if op in (0x0B, 0x10):  # version, stat: the server's own
            out.append("op=%02x status=%d" % (op, status))
            continue
        out.append(
            "magic=%02x op=%02x status=%d opaque=%d cas=%s extras=%s key=%r value=%r"
            % (magic, op, status, opaque, cas_name(cas) if cas else "0", extras.hex(), key, value[:64] + (b"...%d" % len(value) if len(value) > 64 else b""))
        )
        if cas and key:
            cas_of[key] = cas


def flags_exp(flags, exp):
    return struct.pack(">II", flags, exp)


def delta(d, initial, exp):
    return struct.pack(">QQI", d, initial, exp)


def last_cas(k):
    return cas_of.get(k, 1)


BINARY = [
    lambda: breq(0x00, b"x", opaque=1),
    lambda: breq(0x01, b"x", b"hello", flags_exp(9, 0), opaque=2),
    lambda: breq(0x0C, b"x", opaque=3),
    lambda: breq(0x09, b"missing", opaque=4) + breq(0x0D, b"x", opaque=5) + breq(0x0D, b"missing", opaque=6),
    lambda: breq(0x02, b"x", b"v", flags_exp(0, 0), opaque=7),
    lambda: breq(0x03, b"missing", b"v", flags_exp(0, 0), opaque=8),
    lambda: breq(0x03, b"x", b"world", flags_exp(3, 0), opaque=9),
    lambda: breq(0x01, b"x", b"cas!", flags_exp(0, 0), cas=last_cas(b"x") + 1000, opaque=10),
    lambda: breq(0x01, b"x", b"cas ok", flags_exp(0, 0), cas=last_cas(b"x"), opaque=11),
    lambda: breq(0x0C, b"x", opaque=12),
    lambda: breq(0x0E, b"x", b"+tail", opaque=13) + breq(0x0F, b"x", b"head+", opaque=14),
    lambda: breq(0x0E, b"missing", b"+", opaque=15),
    lambda: breq(0x0C, b"x", opaque=16),
    lambda: breq(0x05, b"n", extras=delta(1, 10, 0), opaque=17),
    lambda: breq(0x05, b"n", extras=delta(5, 0, 0), opaque=18),
    lambda: breq(0x06, b"n", extras=delta(100, 0, 0), opaque=19),
    lambda: breq(0x05, b"nocreate", extras=delta(1, 0, 0xFFFFFFFF), opaque=20),
    lambda: breq(0x05, b"x", extras=delta(1, 0, 0), opaque=21),
    lambda: breq(0x15, b"n", extras=delta(1, 0, 0), opaque=22) + breq(0x00, b"n", opaque=23),
    lambda: breq(0x11, b"q", b"quiet", flags_exp(0, 0), opaque=24) + breq(0x12, b"q", b"again", flags_exp(0, 0), opaque=25),
    lambda: breq(0x04, b"q", opaque=26) + breq(0x04, b"q", opaque=27) + breq(0x14, b"q", opaque=28),
    lambda: breq(0x1C, b"x", extras=struct.pack(">I", 100), opaque=29) + breq(0x1C, b"missing", extras=struct.pack(">I", 100), opaque=30),
    lambda: breq(0x1D, b"x", extras=struct.pack(">I", 0), opaque=31) + breq(0x1E, b"missing", extras=struct.pack(">I", 0), opaque=32),
    lambda: breq(0x00, b"x", b"value-on-a-get", opaque=33),
    "reconnect",
    lambda: breq(0x01, b"x", b"v", b"", opaque=34),
    "reconnect",
    lambda: breq(0x5F, b"", opaque=35),
    lambda: breq(0x01, b"x", b"x" * 2000000, flags_exp(0, 0), opaque=36) + breq(0x00, b"x", opaque=44),
    lambda: breq(0x0B, opaque=37),
    lambda: breq(0x01, b"late", b"v", flags_exp(0, 0xFFFFFFF0), opaque=42) + breq(0x00, b"late", opaque=43),
    lambda: breq(0x08, opaque=38) + breq(0x00, b"x", opaque=39),
    lambda: breq(0x18, extras=struct.pack(">I", 0), opaque=40),
]


def main():
    s = connect()
    for cmd in TEXT:
        print("T %s -> %s" % (cmd[:60], text_exchange(s, cmd)))
    s.close()
    s = connect()
    for make in BINARY:
        if make == "reconnect":
            s.close()
            s = connect()
            continue
        frames = make()
        sent = []
        i = 0
        while i < len(frames):
            op, blen, opaque = frames[i + 1], struct.unpack(">I", frames[i + 8 : i + 12])[0], struct.unpack(">I", frames[i + 12 : i + 16])[0]
            sent.append("op=%02x#%d" % (op, opaque))
            i += 24 + blen
        print("B %s -> %s" % (",".join(sent), " ; ".join(bin_exchange(s, frames))))
    # A quit answers, then closes.
    s.sendall(breq(0x07, opaque=41))
    answer = s.recv(24)
    print("B quit -> %s, then %r" % (answer.hex(), s.recv(10)))
    s.close()


main()
