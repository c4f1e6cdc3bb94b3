/*  vm_read.h - reading another process's memory on the same machine (process_vm_readv).

    A same-machine client may name where its values are instead of sending them
    (Request.vm_addrs): the node reads them straight into their place in a segment, one copy
    and one round trip. The kernel decides whether the node may: it must be allowed to trace
    the process (the same user, no stricter Yama setting, or CAP_SYS_PTRACE), and the process
    named is always the one the kernel gave as the ipc peer, so a client can only have its own
    memory read.

    Threads: any.
*/
#ifndef VM_READ_H_INCLUDED
#define VM_READ_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

//  Most ranges one vm_readv takes.
#define VM_READV_MAX 64

//  Reads size bytes at addr in process pid's memory into dst. Returns 0, or an errno:
//  EFAULT (a byte of the range is not that process's memory), EPERM (the kernel lets this
//  process read none of it), ESRCH (no such process), ENOSYS (no process_vm_readv). On
//  failure dst may hold part of the range.
int vm_read (pid_t pid, void *dst, uint64_t addr, size_t size);

//  Reads count ranges (at most VM_READV_MAX) of process pid's memory, remote[i] into
//  local[i], in as few system calls as the kernel allows: one when all goes well. The two
//  lists give the same total length. Returns 0, or an errno as vm_read does; which range
//  failed is not told (vm_read each to know).
int vm_readv (pid_t pid, const struct iovec *local, const struct iovec *remote, size_t count);

void vm_read_test (bool verbose);

#endif
