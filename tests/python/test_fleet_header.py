"""The Python client (the binding of the C++ client) sends x-trainwatch-run on
its Report stream, the metadata a fleet's proxy routes by (docs/fleet.md).
Checked against a grpcio server (Debian's python3-grpcio) that records the
metadata of each call and acknowledges every batch by hand-decoding the
ReportRequest's seq, so the test needs no generated code."""

from concurrent import futures
import threading

import grpc

import trainwatch


def _seq(request: bytes):
    """The seq of a ReportRequest's batch (field 2) or event (field 3), read
    from the wire format; None for the RunStart (field 1)."""
    def varint(buf, i):
        shift = value = 0
        while True:
            b = buf[i]; i += 1
            value |= (b & 0x7F) << shift; shift += 7
            if not b & 0x80: return value, i
    key, i = varint(request, 0)
    if key >> 3 not in (2, 3): return None
    _, i = varint(request, i)            # length of the embedded message
    inner_key, i = varint(request, i)
    return varint(request, i)[0] if inner_key == 0x08 else None  # field 1: seq


def _ack(seq: int) -> bytes:
    out, v = bytearray([0x08]), seq     # ReportResponse.acked_seq = field 1
    while True:
        out.append((v & 0x7F) | (0x80 if v > 0x7F else 0)); v >>= 7
        if not v: return bytes(out)


def test_report_stream_carries_the_run_header():
    seen, lock = [], threading.Lock()

    def report(requests, context):
        with lock:
            seen.append(dict(context.invocation_metadata()))
        for request in requests:
            seq = _seq(request)
            if seq: yield _ack(seq)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "trainwatch.v1.TrainingHealth",
        {"Report": grpc.stream_stream_rpc_method_handler(report)})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with trainwatch.Client(f"127.0.0.1:{port}", run="fleet/python-run", rank=1,
                               world_size=2) as tw:
            for step in range(10):
                tw.record(step, grad_norm=0.5)
            tw.flush(timeout=10)
            assert tw.stats.acked == 10
    finally:
        server.stop(None)
    assert seen, "the client never opened a Report stream"
    assert all(m.get("x-trainwatch-run") == "fleet/python-run" for m in seen), seen
