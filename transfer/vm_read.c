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

//  The kernel copies at most this much a call anyway (it pins the remote pages in groups);
//  asking for more only makes a partial read more likely.
#define VM_READ_STEP (16u << 20)

int
vm_read (pid_t pid, void *dst, uint64_t addr, size_t size)
{
    if (size && addr + size < addr)
        return EFAULT;
    size_t done = 0;
    while (done < size) {
        size_t step = size - done < VM_READ_STEP ? size - done : VM_READ_STEP;
        struct iovec local = {(char *) dst + done, step};
        struct iovec remote = {(void *) (uintptr_t) (addr + done), step};
        ssize_t got = process_vm_readv (pid, &local, 1, &remote, 1, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        //  A short read stops at a page that is not the process's: the next call says why.
        if (got == 0)
            return EFAULT;
        done += (size_t) got;
    }
    return 0;
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
    munmap (pages, page);
    if (verbose)
        printf ("(3 MiB read, faults reported) ");
    free (source);
    free (target);
    printf ("OK\n");
}
