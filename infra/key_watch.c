/*  key_watch.c - closes the open connections of a revoked CURVE key (key_watch.h).

    DESIGN
    conns maps a descriptor ("%d") to the key and SO_COOKIE of the connection last seen on
    it; a closed connection's entry stays until its number is reused (overwritten) or a
    check finds its cookie gone, so the table is never larger than the highest descriptor
    number seen. The cookie is read with every message of a CURVE key (one getsockopt, next
    to the message's decryption): a client that reconnects often gets the same descriptor
    number back, and the watch must know the connection open now, not the one before.

    revoked holds the keys found revoked, so that their messages still queued are dropped
    without asking the ZAP handler per message; each check asks about them again, and a key
    admitted again (its file back) is taken off.
*/
#include "infra/socket_cookie.h"
#include "infra/key_watch.h"

#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "infra/log.h"

typedef struct {
    int fd;
    uint64_t cookie;
    char user[41];
} conn_t;

typedef struct {
    bool exists;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
} stamp_t;

struct _key_watch_t {
    kvp_curve_t *curve;
    char domain[32];
    char what[32];
    char dir[512];
    zhashx_t *conns;   //  "fd" -> conn_t
    zhashx_t *revoked; //  key -> (void *) 1
    stamp_t stamp;     //  the directory as last looked at
    int64_t due;
    uint64_t refused, closed;
};

static void
s_stamp (const char *dir, stamp_t *stamp)
{
    struct stat st;
    memset (stamp, 0, sizeof *stamp);
    if (stat (dir, &st) != 0)
        return;
    stamp->exists = true;
    stamp->dev = st.st_dev;
    stamp->ino = st.st_ino;
    stamp->size = st.st_size;
    stamp->mtime = st.st_mtim;
    stamp->ctime = st.st_ctim;
}

static bool
s_same_stamp (const stamp_t *a, const stamp_t *b)
{
    return a->exists == b->exists && a->dev == b->dev && a->ino == b->ino && a->size == b->size
           && a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec
           && a->ctime.tv_sec == b->ctime.tv_sec && a->ctime.tv_nsec == b->ctime.tv_nsec;
}

static bool
s_curve_key (const char *user_id)
{
    return user_id && strnlen (user_id, 41) == 40;
}

key_watch_t *
key_watch_new (kvp_curve_t *curve, const char *domain, const char *what)
{
    const char *dir = kvp_curve_dir (curve, domain);
    if (!dir || !*dir)
        return NULL;
    key_watch_t *self = (key_watch_t *) zmalloc (sizeof (key_watch_t));
    self->curve = curve;
    snprintf (self->domain, sizeof self->domain, "%s", domain);
    snprintf (self->what, sizeof self->what, "%s", what);
    snprintf (self->dir, sizeof self->dir, "%s", dir);
    self->conns = zhashx_new ();
    zhashx_set_destructor (self->conns, (zhashx_destructor_fn *) zstr_free);
    self->revoked = zhashx_new ();
    assert (self->conns && self->revoked);
    s_stamp (self->dir, &self->stamp);
    self->due = zclock_mono () + KEY_WATCH_INTERVAL_MS;
    return self;
}

void
key_watch_destroy (key_watch_t **self_p)
{
    key_watch_t *self = *self_p;
    if (!self)
        return;
    if (self->refused || self->closed)
        kvp_info ("%s: closed %llu connections of revoked CURVE keys, dropped %llu of their "
                  "messages",
                  self->what, (unsigned long long) self->closed,
                  (unsigned long long) self->refused);
    zhashx_destroy (&self->conns);
    zhashx_destroy (&self->revoked);
    free (self);
    *self_p = NULL;
}

bool
key_watch_seen (key_watch_t *self, int fd, const char *user_id)
{
    if (!self || !s_curve_key (user_id))
        return true;
    uint64_t cookie = socket_cookie (fd);
    if (zhashx_size (self->revoked) && zhashx_lookup (self->revoked, user_id)) {
        //  Queued before its connection was shut down, or from a connection that had sent
        //  nothing until now: nothing is served to it, and its socket is shut down.
        self->refused++;
        if (cookie) {
            shutdown (fd, SHUT_RDWR);
            self->closed++;
        }
        char name[16];
        snprintf (name, sizeof name, "%d", fd);
        zhashx_delete (self->conns, name);
        return false;
    }
    if (!cookie)
        return true;
    char name[16];
    snprintf (name, sizeof name, "%d", fd);
    conn_t *conn = (conn_t *) zhashx_lookup (self->conns, name);
    if (!conn) {
        conn = (conn_t *) zmalloc (sizeof (conn_t));
        conn->fd = fd;
        zhashx_insert (self->conns, name, conn);
    }
    if (conn->cookie != cookie || memcmp (conn->user, user_id, 40) != 0) {
        conn->cookie = cookie;
        memcpy (conn->user, user_id, 40);
        conn->user[40] = 0;
    }
    return true;
}

size_t
key_watch_check (key_watch_t *self, int64_t now)
{
    if (!self || now < self->due)
        return 0;
    self->due = now + KEY_WATCH_INTERVAL_MS;
    stamp_t stamp;
    s_stamp (self->dir, &stamp);
    if (s_same_stamp (&stamp, &self->stamp))
        return 0;
    self->stamp = stamp;

    //  Every distinct key, of the connections open and of those revoked, asked about at once
    //  (the directory is read once): key -> 1 admitted, 2 revoked.
    zlistx_t *gone = zlistx_new ();
    zlistx_set_destructor (gone, (zlistx_destructor_fn *) zstr_free);
    zhashx_t *answers = zhashx_new ();
    for (void *item = zhashx_first (self->revoked); item; item = zhashx_next (self->revoked))
        zhashx_update (answers, (const char *) zhashx_cursor (self->revoked), (void *) 2);
    for (conn_t *conn = (conn_t *) zhashx_first (self->conns); conn;
         conn = (conn_t *) zhashx_next (self->conns)) {
        if (socket_cookie (conn->fd) == conn->cookie)
            zhashx_update (answers, conn->user, (void *) 1);
        else
            zlistx_add_end (gone, strdup ((const char *) zhashx_cursor (self->conns)));
    }
    for (char *name = (char *) zlistx_first (gone); name; name = (char *) zlistx_next (gone))
        zhashx_delete (self->conns, name); //  closed since
    zlistx_purge (gone);
    size_t count = zhashx_size (answers);
    const char **keys_asked = (const char **) zmalloc ((count ? count : 1) * sizeof (char *));
    bool *admitted = (bool *) zmalloc ((count ? count : 1) * sizeof (bool));
    size_t n = 0;
    for (void *item = zhashx_first (answers); item; item = zhashx_next (answers))
        keys_asked[n++] = (const char *) zhashx_cursor (answers);
    kvp_curve_admitted_keys (self->curve, self->domain, keys_asked, n, admitted);
    size_t keys = 0;
    for (size_t i = 0; i < n; i++) {
        bool was_revoked = zhashx_lookup (self->revoked, keys_asked[i]) != NULL;
        if (admitted[i] && was_revoked)
            zhashx_delete (self->revoked, keys_asked[i]); //  its file is back
        else if (!admitted[i] && !was_revoked) {
            zhashx_update (self->revoked, keys_asked[i], (void *) 1);
            keys++;
        }
        zhashx_update (answers, keys_asked[i], (void *) (uintptr_t) (admitted[i] ? 1 : 2));
    }
    free (keys_asked);
    free (admitted);

    size_t closed = 0;
    for (conn_t *conn = (conn_t *) zhashx_first (self->conns); conn;
         conn = (conn_t *) zhashx_next (self->conns)) {
        const char *name = (const char *) zhashx_cursor (self->conns);
        uintptr_t answer = (uintptr_t) zhashx_lookup (answers, conn->user);
        if (answer == 2) {
            shutdown (conn->fd, SHUT_RDWR);
            closed++;
            zlistx_add_end (gone, strdup (name));
        }
    }
    for (char *name = (char *) zlistx_first (gone); name; name = (char *) zlistx_next (gone))
        zhashx_delete (self->conns, name);
    zlistx_destroy (&gone);
    zhashx_destroy (&answers);
    if (closed)
        kvp_info ("%s: closed %zu connections of %zu CURVE keys no longer in %s", self->what,
                  closed, keys, self->dir);
    self->closed += closed;
    return closed;
}

int64_t
key_watch_due (key_watch_t *self)
{
    return self ? self->due : INT64_MAX;
}

uint64_t
key_watch_refused (key_watch_t *self)
{
    return self ? self->refused : 0;
}

uint64_t
key_watch_closed (key_watch_t *self)
{
    return self ? self->closed : 0;
}

//  ---- self test ---------------------------------------------------------------------

//  The next message on router from a connection, with its descriptor and User-Id.
static bool
s_recv (zsock_t *router, int *fd, char *user, size_t user_size)
{
    zmsg_t *msg = zmsg_recv (router);
    if (!msg)
        return false;
    zframe_t *body = zmsg_last (msg);
    const char *text = zframe_meta (body, "__fd");
    *fd = text ? atoi (text) : -1;
    text = zframe_meta (body, "User-Id");
    snprintf (user, user_size, "%s", text ? text : "");
    zmsg_destroy (&msg);
    return true;
}

void
key_watch_test (bool verbose)
{
    if (verbose)
        printf (" * key_watch: ");
    //  Without CURVE there is nothing to watch.
    assert (key_watch_new (NULL, KVP_ZAP_CLIENTS, "test") == NULL);
    assert (key_watch_seen (NULL, 3, "x") && key_watch_check (NULL, INT64_MAX) == 0);

    char dir[] = "/tmp/kvpool-keywatch-XXXXXX";
    assert (mkdtemp (dir));
    char allow[160], server_file[160], secret[170], a_file[170], b_file[170];
    snprintf (allow, sizeof allow, "%s/allow", dir);
    assert (mkdir (allow, 0700) == 0);
    snprintf (server_file, sizeof server_file, "%s/server", dir);
    snprintf (secret, sizeof secret, "%s_secret", server_file);
    snprintf (a_file, sizeof a_file, "%s/a", allow);
    snprintf (b_file, sizeof b_file, "%s/b", allow);
    zcert_t *server = zcert_new (), *a = zcert_new (), *b = zcert_new ();
    assert (zcert_save (server, server_file) == 0);
    assert (zcert_save_public (a, a_file) == 0);
    assert (zcert_save_public (b, b_file) == 0);
    char why[256];
    kvp_trust_args_t args = {.secret_file = secret, .allow_dir = allow};
    kvp_curve_t *curve = kvp_curve_new (&args, why, sizeof why);
    assert (curve);
    assert (key_watch_new (curve, KVP_ZAP_CLUSTER, "test") == NULL); //  no such door
    key_watch_t *watch = key_watch_new (curve, KVP_ZAP_CLIENTS, "test");
    assert (watch);

    zsock_t *router = zsock_new (ZMQ_ROUTER);
    kvp_curve_server (curve, router);
    int port = zsock_bind (router, "tcp://127.0.0.1:*");
    assert (port > 0);
    zsock_set_rcvtimeo (router, 2000);
    zsock_t *client_a = zsock_new (ZMQ_DEALER), *client_b = zsock_new (ZMQ_DEALER);
    zcert_apply (a, client_a);
    zsock_set_curve_serverkey (client_a, zcert_public_txt (server));
    zcert_apply (b, client_b);
    zsock_set_curve_serverkey (client_b, zcert_public_txt (server));
    zsock_set_reconnect_ivl (client_a, 50);
    assert (zsock_connect (client_a, "tcp://127.0.0.1:%d", port) == 0);
    assert (zsock_connect (client_b, "tcp://127.0.0.1:%d", port) == 0);
    int fd_a, fd_b;
    char user_a[64], user_b[64];
    zstr_send (client_a, "a");
    assert (s_recv (router, &fd_a, user_a, sizeof user_a));
    zstr_send (client_b, "b");
    assert (s_recv (router, &fd_b, user_b, sizeof user_b));
    if (strcmp (user_a, zcert_public_txt (a)) != 0) { //  the order the two came in
        int fd = fd_a;
        fd_a = fd_b;
        fd_b = fd;
        char user[64];
        strcpy (user, user_a);
        strcpy (user_a, user_b);
        strcpy (user_b, user);
    }
    assert (streq (user_a, zcert_public_txt (a)) && streq (user_b, zcert_public_txt (b)));
    assert (fd_a >= 0 && fd_b >= 0 && fd_a != fd_b);
    assert (key_watch_seen (watch, fd_a, user_a) && key_watch_seen (watch, fd_b, user_b));
    //  Nothing changed: nothing is asked, nothing closed.
    int64_t now = zclock_mono ();
    assert (key_watch_check (watch, now + KEY_WATCH_INTERVAL_MS) == 0);

    //  A's file goes: A's connection is shut down at the next check, B's stays.
    zsys_file_delete (a_file);
    assert (key_watch_check (watch, now + 2 * KEY_WATCH_INTERVAL_MS) == 1);
    assert (key_watch_closed (watch) == 1);
    zstr_send (client_b, "b again");
    int fd;
    char user[64];
    assert (s_recv (router, &fd, user, sizeof user) && streq (user, user_b));
    assert (key_watch_seen (watch, fd, user));
    //  A's reconnection is refused at its handshake; its message never arrives.
    zstr_send (client_a, "a again");
    zsock_set_rcvtimeo (router, 300);
    assert (!s_recv (router, &fd, user, sizeof user));
    //  A message of a revoked key that still came (queued before) is refused.
    assert (!key_watch_seen (watch, -1, user_a));
    assert (key_watch_refused (watch) == 1);

    //  Its file back: A is admitted again, and served on a new connection (libzmq gives up
    //  a connection whose handshake was refused).
    assert (zcert_save_public (a, a_file) == 0);
    assert (key_watch_check (watch, now + 3 * KEY_WATCH_INTERVAL_MS) == 0);
    assert (key_watch_seen (watch, -1, user_a));
    zsock_destroy (&client_a);
    client_a = zsock_new (ZMQ_DEALER);
    zcert_apply (a, client_a);
    zsock_set_curve_serverkey (client_a, zcert_public_txt (server));
    assert (zsock_connect (client_a, "tcp://127.0.0.1:%d", port) == 0);
    zstr_send (client_a, "a back");
    zsock_set_rcvtimeo (router, 3000);
    assert (s_recv (router, &fd, user, sizeof user) && streq (user, user_a));
    assert (key_watch_seen (watch, fd, user));

    key_watch_destroy (&watch);
    assert (watch == NULL);
    zsock_destroy (&client_a);
    zsock_destroy (&client_b);
    zsock_destroy (&router);
    kvp_curve_destroy (&curve);
    zcert_destroy (&server);
    zcert_destroy (&a);
    zcert_destroy (&b);
    zsys_file_delete (a_file);
    zsys_file_delete (b_file);
    zsys_file_delete (server_file);
    zsys_file_delete (secret);
    zsys_dir_delete ("%s", allow);
    zsys_dir_delete ("%s", dir);
    if (verbose)
        printf ("OK\n");
}
