/*  contract.c - see contract.h. */
#include "protocol/contract.h"

#include <assert.h>
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "kvpool.h"

int
kvp_boot_id (char *buf, size_t size)
{
    buf[0] = 0;
    FILE *file = fopen ("/proc/sys/kernel/random/boot_id", "r");
    if (!file)
        return -1;
    if (!fgets (buf, (int) size, file))
        buf[0] = 0;
    fclose (file);
    size_t len = strlen (buf);
    while (len > 0 && isspace ((unsigned char) buf[len - 1]))
        buf[--len] = 0;
    return len > 0 ? 0 : -1;
}

int
kvp_host_id (char *buf, size_t size)
{
    if (kvp_boot_id (buf, size) != 0)
        return -1;
    struct stat ns;
    if (stat ("/proc/self/ns/net", &ns) == 0) {
        size_t len = strlen (buf);
        snprintf (buf + len, size - len, "-net%llu", (unsigned long long) ns.st_ino);
    }
    return 0;
}

void
kvp_owner_name (char *buf, size_t size, int pid, uint64_t id)
{
    snprintf (buf, size, "pid:%d/%llu", pid, (unsigned long long) id);
}

int
kvp_owner_name_parse (const char *name, uint64_t *id)
{
    int pid;
    unsigned long long value;
    char tail;
    if (!name || sscanf (name, "pid:%d/%llu%c", &pid, &value, &tail) != 2 || value == 0)
        return -1;
    *id = value;
    return 0;
}

void
kvp_contract_test (bool verbose)
{
    //  What applications see in include/kvpool.h is what the node and the library use.
    assert (KVPOOL_PROTOCOL_VERSION == KVP_PROTOCOL_VERSION);
    assert (KVPOOL_MAX_REPLICAS == KVP_MAX_REPLICAS);
    assert (strcmp (KVPOOL_DEFAULT_ENDPOINT, KVP_DEFAULT_ENDPOINT) == 0);
    assert (strcmp (KVPOOL_VERSION, KVP_VERSION) == 0);
    assert (strcmp (KVPOOL_DEFAULT_ADMIN_ENDPOINT, KVP_DEFAULT_ADMIN_ENDPOINT) == 0);
    char id[64];
    assert (kvp_boot_id (id, sizeof id) == 0);
    assert (strlen (id) == 36 && !isspace ((unsigned char) id[35]));
    char host[64];
    assert (kvp_host_id (host, sizeof host) == 0);
    assert (strncmp (host, id, strlen (id)) == 0 && strlen (host) < sizeof host - 1);
    char again[64];
    assert (kvp_host_id (again, sizeof again) == 0 && strcmp (host, again) == 0);
    char name[64];
    uint64_t value = 0;
    kvp_owner_name (name, sizeof name, 12, 34);
    assert (strcmp (name, "pid:12/34") == 0);
    assert (kvp_owner_name_parse (name, &value) == 0 && value == 34);
    assert (kvp_owner_name_parse ("pid:12", &value) == -1);
    assert (kvp_owner_name_parse ("pid:12/34x", &value) == -1);
    assert (kvp_owner_name_parse ("pid:12/0", &value) == -1);
    assert (kvp_owner_name_parse ("client-12-0", &value) == -1);
    assert (kvp_owner_name_parse ("", &value) == -1);
    assert (kvp_owner_name_parse (NULL, &value) == -1);
    if (verbose)
        printf ("boot id %s ", id);
}
