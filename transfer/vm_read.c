/*  vm_read.c - see vm_read.h. */
#include "transfer/vm_read.h"

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

//  Drops the first bytes of a list of ranges: *first is where it starts now.
static void
s_advance (struct iovec *ranges, size_t count, size_t *first, size_t bytes)
{
    while (bytes && *first < count) {
        struct iovec *range = &ranges[*first];
        size_t take = bytes < range->iov_len ? bytes : range->iov_len;
        range->iov_base = (char *) range->iov_base + take;
        range->iov_len -= take;
        bytes -= take;
        if (range->iov_len == 0)
            (*first)++;
    }
}

int
vm_readv (pid_t pid, const struct iovec *local, const struct iovec *remote, size_t count)
{
    if (count > VM_READV_MAX)
        return EINVAL;
    struct iovec to[VM_READV_MAX], from[VM_READV_MAX];
    size_t size = 0, remote_size = 0;
    for (size_t i = 0; i < count; i++) {
        uint64_t addr = (uint64_t) (uintptr_t) remote[i].iov_base;
        if (remote[i].iov_len && addr + remote[i].iov_len < addr)
            return EFAULT;
        to[i] = local[i];
        from[i] = remote[i];
        size += local[i].iov_len;
        remote_size += remote[i].iov_len;
    }
    if (size != remote_size)
        return EINVAL;
    size_t to_first = 0, from_first = 0, done = 0;
    while (done < size) {
        ssize_t got = process_vm_readv (pid, to + to_first, count - to_first, from + from_first,
                                        count - from_first, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        //  A short read stops at a page that is not the process's: the next call says why.
        if (got == 0)
            return EFAULT;
        done += (size_t) got;
        s_advance (to, count, &to_first, (size_t) got);
        s_advance (from, count, &from_first, (size_t) got);
    }
    return 0;
}

int
vm_read (pid_t pid, void *dst, uint64_t addr, size_t size)
{
    struct iovec local = {dst, size};
    struct iovec remote = {(void *) (uintptr_t) addr, size};
    return vm_readv (pid, &local, &remote, 1);
}

//  ---- self test -----------------------------------------------------------------------

void
vm_read_test (bool verbose)
{
    printf (" * vm_read: ");
    size_t size = 3 * 1024 * 1024 + 17;
    char *source = malloc (size);
    char *target = malloc (size);
    assert (source && target);
    for (size_t i = 0; i < size; i++)
        source[i] = (char) (i * 13 + 5);
    //  This process may always read its own memory.
    assert (vm_read (getpid (), target, (uint64_t) (uintptr_t) source, size) == 0);
    assert (memcmp (source, target, size) == 0);
    assert (vm_read (getpid (), target, (uint64_t) (uintptr_t) source, 0) == 0);
    //  Addresses that are not the process's memory.
    assert (vm_read (getpid (), target, 16, 4096) == EFAULT);
    assert (vm_read (getpid (), target, UINT64_MAX - 10, 100) == EFAULT);
    //  A range that runs off the end of a mapping: EFAULT, whatever was read before it.
    size_t page = (size_t) sysconf (_SC_PAGESIZE);
    char *pages = mmap (NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert (pages != MAP_FAILED);
    memset (pages, 7, page);
    assert (munmap (pages + page, page) == 0);
    assert (vm_read (getpid (), target, (uint64_t) (uintptr_t) pages, page) == 0);
    assert (target[page - 1] == 7);
    assert (vm_read (getpid (), target, (uint64_t) (uintptr_t) pages, page + 1) == EFAULT);
    //  Several ranges in one call, of unequal lengths on the two sides.
    memset (target, 0, size);
    struct iovec local[3] = {{target, 5000}, {target + 6000, 100}, {target + 7000, 1 << 20}};
    struct iovec remote[3] = {{source + 10, 5100}, {source + 200000, 1 << 20}, {source, 0}};
    assert (vm_readv (getpid (), local, remote, 2) == EINVAL); //  5100 bytes against 1 MiB more
    assert (vm_readv (getpid (), local, remote, 3) == 0);
    assert (memcmp (target, source + 10, 5000) == 0);
    assert (memcmp (target + 6000, source + 5010, 100) == 0);
    assert (memcmp (target + 7000, source + 200000, 1 << 20) == 0);
    //  A range the process does not have fails the read.
    struct iovec bad[2] = {{source, 100}, {(void *) (uintptr_t) 16, 100}};
    struct iovec into[2] = {{target, 100}, {target + 100, 100}};
    assert (vm_readv (getpid (), into, bad, 2) == EFAULT);
    struct iovec off_end[2] = {{source, 100}, {pages, page + 1}};
    struct iovec into_end[2] = {{target, 100}, {target + 100, page + 1}};
    assert (vm_readv (getpid (), into_end, off_end, 2) == EFAULT);
    assert (vm_readv (getpid (), into, bad, VM_READV_MAX + 1) == EINVAL);
    munmap (pages, page);
    if (verbose)
        printf ("(3 MiB read, faults reported) ");
    free (source);
    free (target);
    printf ("OK\n");
}
