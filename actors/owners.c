/*  owners.c - same-machine client processes, by kernel credentials and pidfd (see owners.h).

    DESIGN
    Live records are found by pid through a hash; each holds a pidfd opened when the process
    was first seen. The pidfd becomes readable when that process exits, which owners_reap
    checks with one poll() over all of them. A record whose process died but that still has
    requests out stays (so the replica-manager hears of its death after its last job); a new
    process that got the same pid meanwhile gets a record of its own, because owners_get
    asks the pidfd before it trusts a record found by pid.
*/
#include "actors/owners.h"

#include <czmq.h>
#include <errno.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "protocol/contract.h"

typedef struct {
    owner_t owner;
    int pidfd;
    bool dead; //  the process exited (it may still have requests out)
} record_t;

struct _owners_t {
    zhashx_t *live; //  "<pid>" -> record_t of the process now holding that pid
    zlistx_t *all;  //  every record, dead ones with requests out included
    size_t max_owners;
    uint64_t next_id;
};

peer_t
owners_peer (const char *peer_address)
{
    peer_t peer = {PEER_INPROC, 0, 0, 0};
    if (!peer_address)
        return peer;
    peer.kind = PEER_REMOTE;
    //  libzmq writes an ipc peer as getnameinfo's "localhost" and ":uid:gid:pid"; a tcp
    //  peer's numeric address (even an IPv6 one, full of colons) never starts that way.
    const char *prefix = "localhost:";
    if (strncmp (peer_address, prefix, strlen (prefix)) != 0)
        return peer;
    unsigned long fields[3];
    const char *at = peer_address + strlen (prefix);
    for (int i = 0; i < 3; i++) {
        if (*at < '0' || *at > '9')
            return peer;
        char *end;
        errno = 0;
        fields[i] = strtoul (at, &end, 10);
        if (errno || (i < 2 ? *end != ':' : *end != 0))
            return peer;
        at = end + 1;
    }
    peer.kind = PEER_LOCAL;
    peer.uid = (uid_t) fields[0];
    peer.gid = (gid_t) fields[1];
    peer.pid = (pid_t) fields[2];
    return peer;
}

static void
s_record_destroy (record_t **record_p)
{
    record_t *record = *record_p;
    if (record) {
        if (record->pidfd >= 0)
            close (record->pidfd);
        free (record);
        *record_p = NULL;
    }
}

owners_t *
owners_new (size_t max_owners)
{
    owners_t *self = (owners_t *) zmalloc (sizeof (owners_t));
    self->live = zhashx_new ();
    self->all = zlistx_new ();
    self->max_owners = max_owners;
    self->next_id = 1;
    return self;
}

void
owners_destroy (owners_t **self_p)
{
    owners_t *self = *self_p;
    if (!self)
        return;
    record_t *record;
    while ((record = (record_t *) zlistx_first (self->all))) {
        zlistx_delete (self->all, zlistx_cursor (self->all));
        s_record_destroy (&record);
    }
    zlistx_destroy (&self->all);
    zhashx_destroy (&self->live);
    free (self);
    *self_p = NULL;
}

static bool
s_exited (record_t *record)
{
    if (record->dead)
        return true;
    struct pollfd poll_fd = {record->pidfd, POLLIN, 0};
    if (poll (&poll_fd, 1, 0) > 0)
        record->dead = true;
    return record->dead;
}

owner_t *
owners_get (owners_t *self, pid_t pid)
{
    if (pid <= 0) {
        errno = ESRCH;
        return NULL;
    }
    char key[16];
    snprintf (key, sizeof key, "%d", (int) pid);
    record_t *record = (record_t *) zhashx_lookup (self->live, key);
    if (record && !s_exited (record))
        return &record->owner;
    if (record)
        zhashx_delete (self->live, key); //  stays in `all` until reaped
    if (zhashx_size (self->live) >= self->max_owners) {
        errno = EMFILE;
        return NULL;
    }
    int pidfd = (int) syscall (SYS_pidfd_open, pid, 0);
    if (pidfd < 0)
        return NULL;
    record = (record_t *) zmalloc (sizeof (record_t));
    record->pidfd = pidfd;
    record->owner.id = self->next_id++;
    record->owner.pid = pid;
    record->owner.pidfd = pidfd;
    kvp_owner_name (record->owner.name, sizeof record->owner.name, (int) pid, record->owner.id);
    zhashx_insert (self->live, key, record);
    zlistx_add_end (self->all, record);
    return &record->owner;
}

bool
owners_alive (owners_t *self, uint64_t id)
{
    for (record_t *record = (record_t *) zlistx_first (self->all); record;
         record = (record_t *) zlistx_next (self->all))
        if (record->owner.id == id)
            return true;
    return false;
}

size_t
owners_reap (owners_t *self, owners_gone_fn *gone, void *arg)
{
    size_t reaped = 0;
    record_t *record = (record_t *) zlistx_first (self->all);
    while (record) {
        if (s_exited (record) && record->owner.jobs_out == 0) {
            char key[16];
            snprintf (key, sizeof key, "%d", (int) record->owner.pid);
            if (zhashx_lookup (self->live, key) == record)
                zhashx_delete (self->live, key);
            zlistx_delete (self->all, zlistx_cursor (self->all));
            gone (arg, &record->owner);
            s_record_destroy (&record);
            reaped++;
            record = (record_t *) zlistx_first (self->all);
        }
        else
            record = (record_t *) zlistx_next (self->all);
    }
    return reaped;
}

size_t
owners_size (owners_t *self)
{
    return zlistx_size (self->all);
}

//  ---- self test ---------------------------------------------------------------------

static void
s_count_gone (void *arg, const owner_t *owner)
{
    (void) owner;
    (*(int *) arg)++;
}

void
owners_test (bool verbose)
{
    peer_t peer = owners_peer (NULL);
    assert (peer.kind == PEER_INPROC);
    peer = owners_peer ("127.0.0.1");
    assert (peer.kind == PEER_REMOTE);
    //  An IPv6 tcp peer whose address ends like credentials is still remote.
    peer = owners_peer ("2001:db8::0:0:1");
    assert (peer.kind == PEER_REMOTE);
    peer = owners_peer ("localhost:1000:1001:4242");
    assert (peer.kind == PEER_LOCAL && peer.uid == 1000 && peer.gid == 1001 && peer.pid == 4242);
    assert (owners_peer ("localhost:1:2").kind == PEER_REMOTE);
    assert (owners_peer ("localhost:1:2:3x").kind == PEER_REMOTE);
    assert (owners_peer ("localhost:-1:2:3").kind == PEER_REMOTE);

    uint64_t id;
    assert (kvp_owner_name_parse ("pid:12/34", &id) == 0 && id == 34);
    assert (kvp_owner_name_parse ("pid:12", &id) == -1);
    assert (kvp_owner_name_parse ("client-12-0", &id) == -1);
    assert (kvp_owner_name_parse ("", &id) == -1);

    owners_t *owners = owners_new (2);
    //  This process: one record, found again by pid.
    owner_t *me = owners_get (owners, getpid ());
    assert (me && me->id == 1 && owners_get (owners, getpid ()) == me);
    assert (owners_alive (owners, me->id));
    assert (owners_get (owners, 0) == NULL);

    //  A child that exits is reported once, after its last request is answered.
    pid_t child = fork ();
    if (child == 0)
        _exit (0);
    owner_t *other = owners_get (owners, child);
    assert (other && other->id == 2);
    other->jobs_out = 1;
    uint64_t other_id = other->id;
    int status;
    waitpid (child, &status, 0);
    int gone = 0;
    assert (owners_reap (owners, s_count_gone, &gone) == 0 && gone == 0);
    assert (owners_alive (owners, other_id));
    other->jobs_out = 0;
    assert (owners_reap (owners, s_count_gone, &gone) == 1 && gone == 1);
    assert (!owners_alive (owners, other_id));
    assert (owners_alive (owners, me->id));
    //  A pid that is gone gets no record.
    assert (owners_get (owners, child) == NULL);
    owners_destroy (&owners);
    if (verbose)
        printf ("peers, records, death after the last request ");
}
