#!/usr/bin/python3
"""raw_zmq_client.py - put and get against kvpoold with nothing but pyzmq and protobuf.

Proves that a client in any language needs nothing of kvpool's but protocol/kvpool.proto: this
script uses no kvpool code, only pyzmq (python3-zmq) and the Python module protoc generates
from the .proto (python3-protobuf, protoc from protobuf-compiler). It uses the generated
kvpool_pb2.py that `make` writes into python/kvpool/, or, failing that, runs protoc on the
.proto itself into a temporary directory.

    python3 python/examples/raw_zmq_client.py [--endpoint tcp://127.0.0.1:50051]
                                              [--proto protocol/kvpool.proto] [--key KEY]

The wire, as protocol/kvpool.proto describes it: a request is a multipart message, frame 0 a
serialized Request, then one raw frame per value (PUT only); the reply is frame 0 a Reply,
then one raw frame per value (GET only). A REQ socket is the simplest client (one request at
a time); a DEALER may pipeline requests and match replies by request_id.

Exit status 0 when every step behaved as the protocol says, 1 otherwise.
"""

import argparse
import importlib
import os
import subprocess
import sys
import tempfile
import uuid

import zmq

def _wire_keys(keys):
    """Keys as the wire carries them: bytes (str keys are UTF-8 encoded)."""
    return [k.encode() if isinstance(k, str) else k for k in keys]


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))


def load_protocol(proto_path):
    """The generated module: python/kvpool/kvpool_pb2.py, else protoc's output for proto_path."""
    generated = os.path.join(REPO, "python", "kvpool")
    if os.path.exists(os.path.join(generated, "kvpool_pb2.py")) and proto_path is None:
        sys.path.insert(0, generated)       # the file alone, not the kvpool package
        return importlib.import_module("kvpool_pb2")
    proto_path = os.path.abspath(proto_path or os.path.join(REPO, "protocol", "kvpool.proto"))
    out = tempfile.mkdtemp(prefix="kvpool-proto-")
    include = os.path.dirname(proto_path)
    subprocess.run(["protoc", "-I", include, "--python_out", out, proto_path], check=True)
    sys.path.insert(0, out)
    return importlib.import_module(os.path.splitext(os.path.basename(proto_path))[0] + "_pb2")


class RawClient:
    """One REQ socket to a kvpoold node; request() sends a Request and returns the Reply and
    the value frames that follow it."""

    def __init__(self, pb, endpoint, timeout_ms):
        self.pb = pb
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.REQ)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVTIMEO, timeout_ms)
        self.socket.setsockopt(zmq.SNDTIMEO, timeout_ms)
        self.socket.connect(endpoint)
        self.next_id = 1

    def request(self, op, keys=(), values=(), **fields):
        request = self.pb.Request(version=1, request_id=self.next_id, op=op, keys=_wire_keys(keys),
                                  **fields)
        self.next_id += 1
        self.socket.send_multipart([request.SerializeToString()] + list(values), copy=False)
        frames = self.socket.recv_multipart()
        reply = self.pb.Reply()
        reply.ParseFromString(frames[0])
        if reply.request_id != request.request_id:
            raise RuntimeError("reply to request %d, expected %d"
                               % (reply.request_id, request.request_id))
        return reply, frames[1:]

    def close(self):
        self.socket.close()
        self.context.term()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", default="tcp://127.0.0.1:50051")
    parser.add_argument("--proto", default=None,
                        help="generate the module from this .proto instead of using "
                             "python/kvpool/kvpool_pb2.py")
    parser.add_argument("--key", default="raw-zmq-example-" + uuid.uuid4().hex[:8])
    parser.add_argument("--timeout-ms", type=int, default=5000)
    args = parser.parse_args()

    pb = load_protocol(args.proto)
    client = RawClient(pb, args.endpoint, args.timeout_ms)
    failures = []

    def expect(what, condition):
        print("%-48s %s" % (what, "ok" if condition else "FAILED"))
        if not condition:
            failures.append(what)

    try:
        reply, _ = client.request(pb.PING)
        expect("PING answered (server %s)" % reply.server_id, reply.status == pb.OK)

        value = b"bytes that never pass through protobuf \x00\x01\x02" * 100
        reply, _ = client.request(pb.PUT, [args.key], [value])
        expect("PUT %s (%d bytes)" % (args.key, len(value)),
               reply.status == pb.OK and list(reply.statuses) == [pb.OK])

        reply, _ = client.request(pb.PUT, [args.key], [b"second value"])
        expect("second PUT says OBJECT_ALREADY_EXISTS",
               list(reply.statuses) == [pb.OBJECT_ALREADY_EXISTS])

        reply, frames = client.request(pb.GET, [args.key])
        expect("GET returns the value in its own frame",
               list(reply.statuses) == [pb.OK] and len(frames) == 1 and frames[0] == value
               and list(reply.sizes) == [len(value)])

        reply, _ = client.request(pb.EXIST, [args.key, args.key + "-absent"])
        expect("EXIST: present and absent",
               list(reply.statuses) == [pb.OK, pb.OBJECT_NOT_FOUND])

        reply, _ = client.request(pb.REMOVE, [args.key], force=True)
        expect("REMOVE (force)", list(reply.statuses) == [pb.OK])

        reply, frames = client.request(pb.GET, [args.key])
        expect("GET after REMOVE says OBJECT_NOT_FOUND",
               list(reply.statuses) == [pb.OBJECT_NOT_FOUND])
    except zmq.Again:
        failures.append("no reply from %s within %d ms" % (args.endpoint, args.timeout_ms))
        print(failures[-1])
    finally:
        client.close()

    print("all steps ok" if not failures else "%d step(s) failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
