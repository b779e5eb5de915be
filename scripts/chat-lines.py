#!/usr/bin/env python3
"""Sends lines of a text to kvpd's /chat websocket as conversations: every TURNS lines
(default 1) are one conversation on its own connection, each line one message.
  scripts/chat-lines.py --port P [--turns N] [--max-tokens N] [--limit N] FILE
Lines that are empty or have fewer than --min-words words are skipped; a line is cut to
--max-chars characters. With --wait-canary TOKEN_FILE, after every turn it waits until the
eviction canary has dealt with it (/admin/stats eviction.canary checked + skipped_busy +
failed + dropped went up), so that no turn of its own makes the canary skip another.
With --record FILE, every turn's message and reply text go to FILE as JSON lines. Prints how many conversations and turns were served; exits 1 when
a turn ends in an error frame or the connection fails."""
import argparse
import base64
import json
import os
import socket
import struct
import sys
import time


class WS:
    def __init__(self, host, port, path, timeout):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        req = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               "Sec-WebSocket-Version: 13\r\n\r\n")
        self.sock.sendall(req.encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            got = self.sock.recv(4096)
            if not got:
                raise ConnectionError("closed during the upgrade")
            self.buf += got
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError("upgrade refused: " + head.split(b"\r\n", 1)[0].decode())

    def send(self, opcode, data):
        mask = os.urandom(4)
        n = len(data)
        if n < 126:
            hdr = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 65536:
            hdr = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            hdr = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        body = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.sock.sendall(hdr + mask + body)

    def _need(self, n):
        while len(self.buf) < n:
            got = self.sock.recv(65536)
            if not got:
                raise ConnectionError("connection closed")
            self.buf += got
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self):
        """One whole message (text), answering pings on the way."""
        parts = []
        while True:
            b0, b1 = self._need(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._need(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._need(8))[0]
            mask = self._need(4) if b1 & 0x80 else None
            data = self._need(n)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            op = b0 & 0x0F
            if op == 0x9:
                self.send(0xA, data)
                continue
            if op == 0xA:
                continue
            if op == 0x8:
                raise ConnectionError("server closed the connection")
            parts.append(data)
            if b0 & 0x80:
                return b"".join(parts).decode("utf-8", "replace")

    def close(self):
        try:
            self.send(0x8, struct.pack("!H", 1000))
        except OSError:
            pass
        self.sock.close()


def canary_done(host, port, token):
    """checked + skipped_busy + failed + dropped of /admin/stats eviction.canary."""
    s = socket.create_connection((host, port), timeout=10)
    s.sendall((f"GET /admin/stats HTTP/1.1\r\nHost: {host}:{port}\r\n"
               f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n").encode())
    data = b""
    while True:
        got = s.recv(65536)
        if not got:
            break
        data += got
    s.close()
    head, body = data.split(b"\r\n\r\n", 1)
    if b"chunked" in head.lower():
        out, rest = b"", body
        while rest:
            size, rest = rest.split(b"\r\n", 1)
            n = int(size, 16)
            if not n:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    c = json.loads(body)["eviction"]["canary"]
    return c["checked"] + c["skipped_busy"] + c["failed"] + c["dropped"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--turns", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--limit", type=int, default=0, help="conversations at most (0: all)")
    ap.add_argument("--min-words", type=int, default=1)
    ap.add_argument("--max-chars", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--wait-canary", metavar="TOKEN_FILE")
    ap.add_argument("--record", metavar="FILE")
    ap.add_argument("file")
    a = ap.parse_args()
    with open(a.file, encoding="utf-8") as f:
        lines = [l.strip()[:a.max_chars] for l in f]
    lines = [l for l in lines if len(l.split()) >= a.min_words]
    convs = [lines[i:i + a.turns] for i in range(0, len(lines) - a.turns + 1, a.turns)]
    if a.limit:
        convs = convs[:a.limit]
    token = open(a.wait_canary).read().strip() if a.wait_canary else None
    record = open(a.record, "w", encoding="utf-8") if a.record else None
    turns = 0
    for conv in convs:
        ws = WS(a.host, a.port, "/chat", a.timeout)
        for text in conv:
            before = canary_done(a.host, a.port, token) if token else 0
            ws.send(0x1, json.dumps({"type": "message", "text": text,
                                     "max_tokens": a.max_tokens}).encode())
            reply = []
            while True:
                m = json.loads(ws.recv())
                if m.get("type") == "token":
                    reply.append(m.get("text", ""))
                if m.get("type") in ("done", "error"):
                    break
            if m.get("type") != "done":
                print(f"chat-lines: turn {turns}: {json.dumps(m)}", file=sys.stderr)
                sys.exit(1)
            if record:
                record.write(json.dumps({"message": text, "reply": "".join(reply)}) + "\n")
            turns += 1
            if token:
                end = time.time() + a.timeout
                while canary_done(a.host, a.port, token) <= before:
                    if time.time() > end:
                        print(f"chat-lines: turn {turns}: the canary did not finish",
                              file=sys.stderr)
                        sys.exit(1)
                    time.sleep(0.02)
        ws.close()
    if record:
        record.close()
    print(f"chat-lines: {len(convs)} conversations, {turns} turns", file=sys.stderr)


if __name__ == "__main__":
    main()
