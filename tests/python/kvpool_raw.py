"""A raw kvpool.v1 client for the Python tests: one DEALER socket, protobuf frames, no
libkvpool. Tests that must see exactly what goes over the wire (statuses, pins, replica
lists) use it beside the kvpool package.

    raw = Raw(daemon.endpoint)            # or daemon.ipc for the same-machine operations
    raw.put("k", b"value")                # returns the key's status
    status, value = raw.get("k")
    reply, frames = raw.call(pb.STATS)
"""

import os
import time

import zmq

from kvpool_test_pb import pb  # noqa: E402 (the generated protocol module)

OK = 0


def default_cluster_key():
    """The cluster key kvpoold uses by default (~/.config/kvpool/cluster.key of this user)."""
    import pwd
    home = os.environ.get("HOME") or pwd.getpwuid(os.geteuid()).pw_dir
    with open(os.path.join(home, ".config", "kvpool", "cluster.key"), "rb") as f:
        return f.read().strip()


class Raw:
    """One DEALER socket speaking kvpool.v1 with raw frames."""

    def __init__(self, endpoint, context=None, timeout_ms=10000, curve=None, cluster_key=None,
                 node="kvpool-node"):
        """curve: (public, secret, server key), Z85 bytes, for a node that runs CURVE.
        cluster_key: the cluster key (bytes; True: the default file's), proved with PLAIN as
        the cluster's own nodes do on the data plane and at the master (node: the user name
        said with it)."""
        self.sock = (context or zmq.Context.instance()).socket(zmq.DEALER)
        self.sock.linger = 0
        if curve:
            self.sock.curve_publickey, self.sock.curve_secretkey, self.sock.curve_serverkey = curve
        if cluster_key is not None:
            if cluster_key is True:
                cluster_key = default_cluster_key()
            self.sock.plain_username = node.encode()
            self.sock.plain_password = cluster_key
        self.sock.connect(endpoint)
        self.timeout_ms = timeout_ms
        self.next_id = 1

    def send(self, op, keys=(), values=(), **fields):
        request = pb.Request(version=1, request_id=self.next_id, op=op,
                             keys=[k.encode() if isinstance(k, str) else k for k in keys],
                             **fields)
        self.next_id += 1
        self.sock.send_multipart([request.SerializeToString()] + list(values))
        return request.request_id

    def recv(self, request_id, timeout_ms=None):
        """The reply to request_id and its value frames, or (None, None) after the timeout
        (timeout_ms, or the client's)."""
        wait = self.timeout_ms if timeout_ms is None else timeout_ms
        deadline = time.monotonic() + wait / 1000
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0 or not self.sock.poll(left):
                return None, None
            frames = self.sock.recv_multipart()
            reply = pb.Reply()
            reply.ParseFromString(frames[0])
            if reply.request_id == request_id:
                return reply, frames[1:]

    def call(self, op, keys=(), values=(), **fields):
        reply, frames = self.recv(self.send(op, keys, values, **fields))
        assert reply is not None, "no answer to op %d" % op
        return reply, frames

    def status(self, op, key, **fields):
        reply, _ = self.call(op, [key], **fields)
        return reply.status or reply.statuses[0]

    def put(self, key, value, **options):
        reply, _ = self.call(pb.PUT, [key], [value], **options)
        return reply.status or reply.statuses[0]

    def get(self, key):
        reply, frames = self.call(pb.GET, [key])
        status = reply.status or reply.statuses[0]
        return status, (frames[0] if status == OK else None)

    def exist(self, key):
        return self.status(pb.EXIST, key) == OK

    def remove(self, key, force=False):
        return self.status(pb.REMOVE, key, force=force)

    def stats(self):
        reply, _ = self.call(pb.STATS)
        return reply.stats

    def index_gets(self):
        return self.stats().index_gets

    def segments(self):
        reply, _ = self.call(pb.SEGMENTS)
        return list(reply.segments)

    def replica_segments(self, key):
        """The sorted segment ids of key's replicas, or None when it has none to list."""
        reply, _ = self.call(pb.GET_REPLICA_LIST, [key])
        if (reply.status or reply.statuses[0]) != OK:
            return None
        return sorted(r.segment_id for r in reply.replicas[0].replicas)

    def close(self):
        self.sock.close()
