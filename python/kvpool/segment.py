"""kvpool.segment - memory a process gives the pool: a sealed memfd a kvpoold node mounts.

    seg = kvpool.SharedSegment(512 << 20)
    seg_id = client.mount_segment(seg.name, seg.size)   # the node may now store objects in it
    ...
    client.unmount_segment(seg_id)
    seg.close()

A node keeps other clients' data in this memory, and a mapping whose file shrinks faults
with SIGBUS, so a node mounts only a memfd sealed against shrinking (F_SEAL_SHRINK). The
segment is made here with its pages committed up front (a lack of memory fails now, not on
a later write) and sealed against shrinking and growing, and is named
"/proc/<pid>/fd/<fd>", the path the node and other processes on the machine open it by.
Keep it open while it is mounted. It leaves nothing behind: the kernel frees it when the
last process holding it lets go, so a client that dies cannot leak it.
"""

import fcntl
import os


class SharedSegment:
    """A sealed memfd of size bytes; .name is what mount_segment takes."""

    def __init__(self, size, tag="kvpool-client"):
        if size <= 0:
            raise ValueError("a segment needs a positive size")
        self.size = size
        self.pid = os.getpid()
        fd = os.memfd_create(tag, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        except OSError:
            os.close(fd)
            raise
        self.fd = fd
        self.name = "/proc/%d/fd/%d" % (self.pid, fd)
        self.id = None      # the node's segment id once mounted (the caller's to set)

    @property
    def closed(self):
        return self.fd is None

    def close(self):
        """Lets go of the memory (unmount it first). Only the creating process closes it: a
        forked child's copy of the descriptor is its own."""
        if self.fd is not None and self.pid == os.getpid():
            os.close(self.fd)
        self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "SharedSegment(name=%r, size=%d)" % (self.name, self.size)
