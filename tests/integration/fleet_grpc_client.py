#!/usr/bin/python3
"""An independent gRPC client for the fleet test: Python grpcio (Debian's
python3-grpcio) with message classes that protoc generates from the proto
(protoc --python_out), and the Report method called by hand through
channel.stream_stream, so nothing of trainwatch's own clients is involved.
Sets the routing metadata x-trainwatch-run itself.

  fleet_grpc_client.py PB2_DIR ADDRESS RUN RANK WORLD_SIZE STEPS

Streams RunStart then STEPS steps (0..STEPS-1) in batches of 50, waits until
every batch is acknowledged, and prints "acked N". Exit 1 on any error.
"""
import sys

import grpc

pb2_dir, address, run, rank, world, steps = sys.argv[1:7]
sys.path.insert(0, pb2_dir)
from trainwatch.v1 import trainwatch_pb2 as pb  # noqa: E402

rank, world, steps = int(rank), int(world), int(steps)
BATCH = 50


def requests():
    yield pb.ReportRequest(start=pb.RunStart(run_id=run, rank=rank, world_size=world,
                                             max_norm=1.0))
    seq = 0
    for first in range(0, steps, BATCH):
        seq += 1
        batch = pb.StepBatch(seq=seq)
        for step in range(first, min(first + BATCH, steps)):
            batch.records.add(step=step, grad_norm=0.5 + 0.001 * (step % 7))
        yield pb.ReportRequest(batch=batch)


def main():
    last_seq = (steps + BATCH - 1) // BATCH
    with grpc.insecure_channel(address) as channel:
        report = channel.stream_stream(
            "/trainwatch.v1.TrainingHealth/Report",
            request_serializer=pb.ReportRequest.SerializeToString,
            response_deserializer=pb.ReportResponse.FromString)
        # The generator ends after the last batch, which half-closes the
        # stream; the server acks what it committed, then finishes.
        responses = report(requests(), metadata=[("x-trainwatch-run", run)], timeout=60)
        acked = 0
        for response in responses:
            acked = max(acked, response.acked_seq)
            if acked >= last_seq:
                break
        responses.cancel()
    if acked < last_seq:
        print(f"only seq {acked} of {last_seq} acknowledged", file=sys.stderr)
        return 1
    print(f"acked {steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
