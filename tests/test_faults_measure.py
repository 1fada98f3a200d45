"""Faults around measuring and its records, injected through the real CLI with real sockets, files and compilers:
a --ray address where no Ray head answers, a damaged database file, a compiler that breaks mid-run, Ctrl-C."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_faults_env import assert_one_line_error, cli

from tensorgen.errors import ClusterError
from tensorgen.measure.ray import check_head
from tensorgen.measure.ray_probe import probe

TUNE = ["tune", "gmm", "--shape", "32,32,32", "--policy", "random"]


# ---- fault 4: --ray ADDRESS where no Ray head answers ----------------------------------------------------------


@pytest.fixture
def web_server() -> Iterator[str]:
    """HOST:PORT of a real HTTP server (it takes the TCP connection, then answers HTTP/1)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent_server() -> Iterator[str]:
    """HOST:PORT of a socket that takes connections (the kernel's backlog) and never says a word."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def test_an_address_where_no_ray_head_answers_is_refused_in_bounded_time(web_server, silent_server):
    assert not probe(web_server).head and "not gRPC" in probe(web_server).why
    with pytest.raises(ClusterError, match=r"is not a Ray head \(no answer in 1 s\): start one with `ray start"):
        check_head(silent_server, timeout=1.0)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # bound, not listening: refused
        assert probe(f"127.0.0.1:{port}").why == "Connection refused"


@pytest.mark.parametrize("command", [[*TUNE, "--trials", "8"], ["worker"]], ids=["tune", "worker"])
def test_cli_ray_at_a_web_server_is_one_line(command, web_server, tmp_path):
    # before: `tune` kept running past 300 s (ray.init retries a port that takes TCP connections for ever)
    proc = cli([*command, "--ray", web_server], {}, tmp_path, timeout=120)
    assert_one_line_error(proc, f"{web_server} is not a Ray head (it answers ")
    assert "ray start --head" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
