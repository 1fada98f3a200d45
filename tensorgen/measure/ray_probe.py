"""Ask an address whether a Ray head answers there, in a bounded time, before ray.init is let near it.

ray.init checks nothing up front: given a port where something else listens (a web server), it retries for ever;
given an address a proxy or firewall accepts and drops, it prints pages of warnings before failing. A TCP
connect proves nothing (some networks accept every connection), so this makes one real call of the head's own
protocol: a gRPC request (HTTP/2 written by hand, ray ships no Python gRPC) to the GCS's
NodeInfoGcsService/GetClusterId, or to the Ray Client server's RayletDriver/ClusterInfo for ray://HOST:PORT,
both with an empty message. The address is a Ray head if a gRPC message comes back on the request's stream.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
GCS_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
CLIENT_METHOD = "/ray.rpc.RayletDriver/ClusterInfo"
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x7
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
STREAM = 1  # the one request's stream


@dataclass(frozen=True)
class Answer:
    """What an address said to the probe.

    Fields:
        head: a Ray head answered the call.
        why: if not, what happened instead (for the user: 'connection refused', 'no answer in 5 s', ...)."""

    head: bool
    why: str = ""


def frame(kind: int, flags: int, payload: bytes = b"", stream: int = 0) -> bytes:
    """One HTTP/2 frame."""
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def hpack_length(n: int) -> bytes:
    """An HPACK string length (7-bit prefix integer, no Huffman coding)."""
    if n < 127:
        return bytes([n])
    out, n = [127], n - 127
    while n >= 128:
        out.append(n % 128 + 128)
        n //= 128
    return bytes([*out, n])


def grpc_request(authority: str, method: str) -> bytes:
    """The client's bytes of a unary gRPC call of `method` with an empty message: preface, settings, headers
    (HPACK literals without indexing), and the message's DATA frame ending the stream."""
    fields = [(":method", "POST"), (":scheme", "http"), (":path", method), (":authority", authority),
              ("content-type", "application/grpc"), ("te", "trailers")]
    block = b"".join(b"\x00" + hpack_length(len(k)) + k.encode() + hpack_length(len(v)) + v.encode()
                     for k, v in fields)
    return (PREFACE + frame(SETTINGS, 0) + frame(HEADERS, END_HEADERS, block, STREAM)
            + frame(DATA, END_STREAM, b"\x00\x00\x00\x00\x00", STREAM))


def probe(address: str, timeout: float = 5.0) -> Answer:
    """Whether a Ray head answers at `address` (HOST:PORT, or ray://HOST:PORT for Ray Client) within `timeout`
    seconds in all."""
    client = address.startswith("ray://")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
            sock.sendall(grpc_request(f"{host}:{port}", CLIENT_METHOD if client else GCS_METHOD))
            return read_answer(sock, deadline, timeout)
    except TimeoutError:
        return Answer(False, f"no answer in {timeout:g} s")
    except OSError as err:
        return Answer(False, err.strerror or str(err))


def read_answer(sock: socket.socket, deadline: float, timeout: float) -> Answer:
    """Read the server's frames until the call's reply decides it (see probe)."""
    buf, message = b"", b""
    while True:
        sock.settimeout(max(deadline - time.monotonic(), 1e-3))
        chunk = sock.recv(65536)
        if not chunk:
            return Answer(False, "it closed the connection without a gRPC answer" if buf else
                          "it closed the connection without a word of HTTP/2")
        if not buf and not chunk.startswith(b"\x00"):  # HTTP/1 text, an SSH banner, ...: not a frame header
            return Answer(False, f"it answers {chunk[:24].decode(errors='replace').split(chr(10))[0]!r}, "
                                 f"not gRPC")
        buf += chunk
        while len(buf) >= 9 and len(buf) >= 9 + (size := int.from_bytes(buf[:3], "big")):
            kind, flags, stream = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
            payload, buf = buf[9:9 + size], buf[9 + size:]
            if kind == SETTINGS and not flags & ACK:
                sock.sendall(frame(SETTINGS, ACK))
            elif kind == DATA and stream == STREAM:
                message += payload
                if len(message) >= 5:  # a gRPC message: uncompressed flag, then its length
                    return Answer(message[0] == 0, "" if message[0] == 0 else "its answer is not a gRPC message")
            elif kind == GOAWAY or (stream == STREAM and (kind == RST_STREAM or flags & END_STREAM)):
                return Answer(False, "it speaks HTTP/2 but has no Ray GCS service")
