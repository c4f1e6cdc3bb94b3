/*  curve.c - who may connect to kvpoold's ZeroMQ sockets (curve.h).

    DESIGN
    Two kinds of door, each with its own credential (docs/security.md):
    - client doors (the client ROUTER, the lookup/reset admin ROUTER, the KV-events PUB and
      replay ROUTER): with CURVE, a client whose public key is in --curve-allow; without
      CURVE they bind loopback only and the api tells local users apart by the kernel's word.
    - inner doors (the master's ROUTER and every node's data plane): only the cluster's own
      nodes and master. With CURVE, a key in --curve-nodes (a client key, admitted at the
      client doors or not, is refused); without CURVE, the cluster key (--cluster-key, a file
      of mode 0600), proved with ZeroMQ's PLAIN mechanism. PLAIN sends the key in the clear,
      which is why it is only used where nothing leaves the machine (loopback, or --insecure
      on a trusted network): a local user who cannot read the file cannot act as a node.

    The ZAP handler is this file's own actor, one per process, bound on CZMQ's context where
    every socket of the node lives; libzmq asks it about every handshake on a socket that
    has a ZAP domain. The domain says which door: KVP_ZAP_CLIENTS or KVP_ZAP_CLUSTER. Each
    allow directory is a zcertstore, read again on a lookup after the directory changed, so a
    key is admitted or revoked by adding or removing its file. The handler answers with the
    peer's public key (CURVE) or "kvpool-node" (PLAIN) as the connection's User-Id, which
    libzmq attaches to every message from it: kvp_curve_admitted says whether that key is
    still admitted now, so that the sockets' owners close a revoked key's connections
    (key_watch.h).

    Threads: the ZAP actor (kvp-zap, its loop: infra/actor_shell.h) owns the certificate
    stores; kvp_curve_admitted asks it over a pipe (under a mutex, from any thread).
    Everything else here is set before the actors start and only read after.
*/
#include "infra/curve.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <pwd.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "infra/actor_shell.h"
#include "infra/endpoints.h"
#include "infra/log.h"

//  zcert's secret key of a certificate loaded from a public file: all zero bytes.
#define NO_SECRET "0000000000000000000000000000000000000000"
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
//  The user name a node proves the cluster key under (PLAIN).
#define CLUSTER_USER "kvpool-node"
#define CLUSTER_KEY_MIN 32
#define CLUSTER_KEY_MAX 255

struct _kvp_curve_t {
    zcert_t *cert; //  NULL: no CURVE
    char master_key[41];
    char allow_dir[512];
    char nodes_dir[512];
    char cluster_key[CLUSTER_KEY_MAX + 1]; //  "" : no cluster (role all) or CURVE
    char cluster_key_file[512];
    char node_id[200]; //  the node's id, said with the cluster key (kvp_curve_set_node)
    zactor_t *zap;
    pthread_mutex_t ask; //  one kvp_curve_admitted at a time on the actor's pipe
    uint64_t refused;    //  handshakes refused (the ZAP actor's count, read at the end)
};

//  Loads a certificate file, public or secret; NULL with why.
static zcert_t *
s_load (const char *what, const char *file, char *why, size_t why_size)
{
    struct stat st;
    errno = 0;
    if (stat (file, &st) != 0 || !S_ISREG (st.st_mode)) {
        snprintf (why, why_size, "%s %s: %s", what, file, errno ? strerror (errno) : "not a file");
        return NULL;
    }
    zcert_t *cert = zcert_load (file);
    if (!cert || strlen (zcert_public_txt (cert)) != 40
        || !strcmp (zcert_public_txt (cert), NO_SECRET)) {
        snprintf (why, why_size, "%s %s: not a CURVE certificate (make one with kvpool keygen)",
                  what, file);
        zcert_destroy (&cert);
        return NULL;
    }
    return cert;
}

static int
s_check_dir (const char *what, const char *dir, char *why, size_t why_size)
{
    struct stat st;
    errno = 0;
    if (!dir || stat (dir, &st) != 0 || !S_ISDIR (st.st_mode)) {
        snprintf (why, why_size, "%s %s: %s", what, dir ? dir : "(not set)",
                  dir && errno ? strerror (errno) : "not a directory");
        return -1;
    }
    return 0;
}

//  ---- the cluster key ---------------------------------------------------------------

int
kvp_cluster_key_default (char *path, size_t size)
{
    const char *home = getenv ("HOME");
    if (!home || !*home) {
        struct passwd *pw = getpwuid (geteuid ());
        home = pw ? pw->pw_dir : NULL;
    }
    if (!home || !*home)
        return -1;
    return snprintf (path, size, "%s/.config/kvpool/cluster.key", home) < (int) size ? 0 : -1;
}

//  mkdir -p of path's folders, mode 0700 for those it makes.
static void
s_make_parents (const char *path)
{
    char dir[512];
    snprintf (dir, sizeof dir, "%s", path);
    for (char *slash = strchr (dir + 1, '/'); slash; slash = strchr (slash + 1, '/')) {
        *slash = 0;
        if (mkdir (dir, 0700) != 0 && errno != EEXIST)
            return;
        *slash = '/';
    }
}

int
kvp_cluster_key_write (const char *file, char *why, size_t why_size)
{
    uint8_t random[32];
    if (getrandom (random, sizeof random, 0) != (ssize_t) sizeof random) {
        snprintf (why, why_size, "getrandom: %s", strerror (errno));
        return -1;
    }
    char text[2 * sizeof random + 2];
    for (size_t i = 0; i < sizeof random; i++)
        snprintf (text + 2 * i, 3, "%02x", random[i]);
    strcat (text, "\n");
    s_make_parents (file);
    //  Written whole under a name of its own, then linked into place: two daemons starting
    //  at once never read a key half written, and an existing key is never replaced (link
    //  fails with EEXIST).
    char temporary[600];
    snprintf (temporary, sizeof temporary, "%s.%d.tmp", file, (int) getpid ());
    unlink (temporary);
    int fd = open (temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf (why, why_size, "%s: %s", temporary, strerror (errno));
        return -1;
    }
    ssize_t wrote = write (fd, text, strlen (text));
    int synced = fsync (fd);
    close (fd);
    if (wrote != (ssize_t) strlen (text) || synced != 0) {
        unlink (temporary);
        snprintf (why, why_size, "%s: cannot write it", temporary);
        return -1;
    }
    int linked = link (temporary, file);
    int saved = errno;
    unlink (temporary);
    if (linked != 0) {
        errno = saved;
        snprintf (why, why_size, "%s: %s", file, strerror (saved));
        return -1;
    }
    return 0;
}

//  Reads the cluster key: a regular file of this user's, readable by nobody else, holding
//  32 to 255 printable characters. Makes one where none is and create is set.
static int
s_cluster_key_load (kvp_curve_t *self, const char *file, bool create, char *why,
                    size_t why_size)
{
    snprintf (self->cluster_key_file, sizeof self->cluster_key_file, "%s", file);
    int fd = open (file, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && create) {
        if (kvp_cluster_key_write (file, why, why_size) == 0)
            kvp_info ("made the cluster key %s (mode 0600): give every node and the master of "
                      "this cluster the same file (--cluster-key)",
                      file);
        else if (errno != EEXIST) //  (EEXIST: another daemon made it just now)
            return -1;
        fd = open (file, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    }
    if (fd < 0) {
        snprintf (why, why_size, "--cluster-key %s: %s", file, strerror (errno));
        return -1;
    }
    struct stat st;
    char text[CLUSTER_KEY_MAX + 2];
    ssize_t got = -1;
    if (fstat (fd, &st) != 0 || !S_ISREG (st.st_mode))
        snprintf (why, why_size, "--cluster-key %s: not a regular file", file);
    else if (st.st_uid != geteuid ())
        snprintf (why, why_size, "--cluster-key %s: owned by user %u, not by this user (%u)",
                  file, (unsigned) st.st_uid, (unsigned) geteuid ());
    else if (st.st_mode & 077)
        snprintf (why, why_size,
                  "--cluster-key %s: mode %03o lets other users read it (and act as nodes): "
                  "chmod 600 it",
                  file, (unsigned) (st.st_mode & 0777));
    else
        got = read (fd, text, sizeof text - 1);
    close (fd);
    if (got < 0)
        return -1;
    text[got] = 0;
    while (got > 0 && (text[got - 1] == '\n' || text[got - 1] == '\r' || text[got - 1] == ' '))
        text[--got] = 0;
    bool printable = true;
    for (ssize_t i = 0; i < got; i++)
        printable &= text[i] > ' ' && text[i] < 127;
    if (got < CLUSTER_KEY_MIN || got > CLUSTER_KEY_MAX || !printable) {
        snprintf (why, why_size,
                  "--cluster-key %s: %d to %d printable characters on one line (kvpool keygen "
                  "--cluster FILE writes one)",
                  file, CLUSTER_KEY_MIN, CLUSTER_KEY_MAX);
        return -1;
    }
    memcpy (self->cluster_key, text, (size_t) got + 1);
    return 0;
}

//  ---- the ZAP handler ---------------------------------------------------------------

typedef struct {
    zsock_t *pipe;
    zsock_t *handler;
    kvp_curve_t *owner;
    zcertstore_t *clients; //  NULL: no CURVE
    zcertstore_t *nodes;   //  NULL: no CURVE cluster
} zap_t;

//  Constant-time comparison of two strings (a key proved by a peer).
static bool
s_same_secret (const char *a, size_t a_len, const char *b)
{
    size_t b_len = strlen (b);
    unsigned char diff = a_len != b_len;
    for (size_t i = 0; i < a_len && i < b_len; i++)
        diff |= (unsigned char) (a[i] ^ b[i]);
    return diff == 0;
}

//  A PLAIN user name of a node: "kvpool-node", or "kvpool-node/<node id>" (printable).
static bool
s_node_user (zframe_t *name)
{
    size_t size = zframe_size (name), prefix = strlen (CLUSTER_USER);
    const char *text = (const char *) zframe_data (name);
    if (size < prefix || size > KVP_USER_ID_MAX || memcmp (text, CLUSTER_USER, prefix) != 0)
        return false;
    if (size == prefix)
        return true;
    if (text[prefix] != '/' || size == prefix + 1)
        return false;
    for (size_t i = prefix + 1; i < size; i++)
        if (text[i] <= ' ' || text[i] >= 127)
            return false;
    return true;
}

//  One ZAP request (RFC 27): [version, request id, domain, address, routing id,
//  mechanism, credentials...]. Replies 200 with the User-Id, or 400.
static void
s_zap_request (zap_t *self)
{
    zmsg_t *request = zmsg_recv (self->handler);
    if (!request)
        return;
    char *version = zmsg_popstr (request);
    char *sequence = zmsg_popstr (request);
    char *domain = zmsg_popstr (request);
    char *address = zmsg_popstr (request);
    zframe_t *routing = zmsg_pop (request);
    char *mechanism = zmsg_popstr (request);
    const char *status = "400", *text = "refused";
    char user[KVP_USER_ID_MAX + 1] = "";
    bool cluster = domain && streq (domain, KVP_ZAP_CLUSTER);
    bool clients = domain && streq (domain, KVP_ZAP_CLIENTS);
    if (version && streq (version, "1.0") && mechanism && (cluster || clients)) {
        if (streq (mechanism, "CURVE")) {
            zframe_t *key = zmsg_pop (request);
            zcertstore_t *store = cluster ? self->nodes : self->clients;
            if (key && zframe_size (key) == 32 && store) {
                char z85[41];
                zmq_z85_encode (z85, zframe_data (key), 32);
                if (zcertstore_lookup (store, z85)) {
                    status = "200";
                    text = "OK";
                    snprintf (user, sizeof user, "%s", z85);
                }
            }
            zframe_destroy (&key);
        }
        else if (streq (mechanism, "PLAIN") && cluster && *self->owner->cluster_key) {
            zframe_t *name = zmsg_pop (request);
            zframe_t *password = zmsg_pop (request);
            if (name && password && s_node_user (name)
                && s_same_secret ((const char *) zframe_data (password), zframe_size (password),
                                  self->owner->cluster_key)) {
                status = "200";
                text = "OK";
                snprintf (user, sizeof user, "%.*s", (int) zframe_size (name),
                          (const char *) zframe_data (name));
            }
            zframe_destroy (&name);
            zframe_destroy (&password);
        }
    }
    if (*status != '2') {
        self->owner->refused++;
        kvp_info ("refused a %s connection from %s (%s): %s",
                  cluster ? "node" : "client", address ? address : "?",
                  mechanism ? mechanism : "?",
                  cluster ? "not a credential of this cluster's nodes (--curve-nodes or "
                            "--cluster-key)"
                          : "its key is not in --curve-allow");
    }
    zmsg_t *reply = zmsg_new ();
    zmsg_addstr (reply, "1.0");
    zmsg_addstr (reply, sequence ? sequence : "");
    zmsg_addstr (reply, status);
    zmsg_addstr (reply, text);
    zmsg_addstr (reply, user);
    zmsg_addmem (reply, NULL, 0);
    zmsg_send (&reply, self->handler);
    zstr_free (&version);
    zstr_free (&sequence);
    zstr_free (&domain);
    zstr_free (&address);
    zframe_destroy (&routing);
    zstr_free (&mechanism);
    zmsg_destroy (&request);
}

//  The public keys of the certificates in dir as they are now, read as zcertstore's disk
//  loader reads them (every regular file, in sub-folders too, that zcert_load takes).
static zhashx_t *
s_keys_now (const char *dir)
{
    zhashx_t *keys = zhashx_new ();
    zdir_t *folder = zdir_new (dir, NULL);
    zfile_t **files = folder ? zdir_flatten (folder) : NULL;
    for (size_t i = 0; files && files[i]; i++) {
        if (!zfile_is_regular (files[i]))
            continue;
        zcert_t *cert = zcert_load (zfile_filename (files[i], NULL));
        if (cert)
            zhashx_update (keys, zcert_public_txt (cert), (void *) 1);
        zcert_destroy (&cert);
    }
    zdir_flatten_free (&files);
    zdir_destroy (&folder);
    return keys;
}

//  A pipe command: ADMITTED <domain> <key> (answered with "1" or "0"); or
//  ADMITTED_KEYS <domain> <key>... (answered with one frame of "1" and "0", one per key).
static int
s_zap_command (actor_shell_t *shell, const char *command, zmsg_t *msg, void *arg)
{
    (void) shell;
    zap_t *self = (zap_t *) arg;
    char *domain = zmsg_popstr (msg);
    bool cluster = domain && streq (domain, KVP_ZAP_CLUSTER);
    zcertstore_t *store = cluster ? self->nodes : self->clients;
    if (streq (command, "ADMITTED_KEYS")) {
        //  The directory read once: a lookup in the handler's store reads it every time.
        zhashx_t *now = store ? s_keys_now (cluster ? self->owner->nodes_dir
                                                    : self->owner->allow_dir)
                              : NULL;
        size_t count = zmsg_size (msg);
        char *answer = (char *) zmalloc (count + 1);
        size_t i = 0;
        for (char *key = zmsg_popstr (msg); key; key = zmsg_popstr (msg), i++) {
            answer[i] = !now || strlen (key) != 40 || zhashx_lookup (now, key) ? '1' : '0';
            zstr_free (&key);
        }
        zsock_send (self->pipe, "b", answer, count);
        free (answer);
        zhashx_destroy (&now);
    }
    else {
        char *key = zmsg_popstr (msg);
        bool admitted = true;
        if (streq (command, "ADMITTED") && key && strlen (key) == 40)
            admitted = !store || zcertstore_lookup (store, key) != NULL;
        zstr_send (self->pipe, admitted ? "1" : "0");
        zstr_free (&key);
    }
    zstr_free (&domain);
    return 0;
}

static int
s_zap_reader (actor_shell_t *shell, zsock_t *handler, void *arg)
{
    (void) shell;
    (void) handler;
    s_zap_request ((zap_t *) arg);
    return 0;
}

//  The ZAP handler's REP, where libzmq asks (one a process).
static const actor_socket_t s_zap_handler = {ZMQ_REP, "@" ZAP_ENDPOINT, ACTOR_HWM_LIBZMQ,
                                             ACTOR_HWM_LIBZMQ, s_zap_reader, false};

static void
s_zap_actor (zsock_t *pipe, void *args)
{
    actor_shell_t *shell = actor_shell_new (pipe, "kvp-zap");
    zap_t self = {.pipe = pipe, .owner = (kvp_curve_t *) args};
    self.handler = actor_shell_open (shell, &s_zap_handler, NULL);
    if (self.owner->cert) {
        self.clients = zcertstore_new (self.owner->allow_dir);
        if (*self.owner->nodes_dir)
            self.nodes = zcertstore_new (self.owner->nodes_dir);
    }
    if (self.handler) {
        actor_shell_on_command (shell, s_zap_command);
        actor_shell_run (shell, &self);
    }
    else
        actor_shell_ready (shell, 1); //  another ZAP handler in the process
    zcertstore_destroy (&self.clients);
    zcertstore_destroy (&self.nodes);
    actor_shell_destroy (&shell); //  (the handler)
}

//  ---- the object --------------------------------------------------------------------

kvp_curve_t *
kvp_curve_new (const kvp_trust_args_t *args, char *why, size_t why_size)
{
    kvp_curve_t *self = (kvp_curve_t *) zmalloc (sizeof (kvp_curve_t));
    pthread_mutex_init (&self->ask, NULL);
    if (args->secret_file) {
        if (s_check_dir ("--curve-allow", args->allow_dir, why, why_size) != 0
            || (args->cluster
                && s_check_dir ("--curve-nodes", args->nodes_dir, why, why_size) != 0)) {
            kvp_curve_destroy (&self);
            return NULL;
        }
        self->cert = s_load ("--curve-secret", args->secret_file, why, why_size);
        if (!self->cert) {
            kvp_curve_destroy (&self);
            return NULL;
        }
        if (!strcmp (zcert_secret_txt (self->cert), NO_SECRET)) {
            snprintf (why, why_size,
                      "--curve-secret %s holds no secret key: give the NAME_secret file that "
                      "kvpool keygen NAME wrote",
                      args->secret_file);
            kvp_curve_destroy (&self);
            return NULL;
        }
        snprintf (self->allow_dir, sizeof self->allow_dir, "%s", args->allow_dir);
        if (args->cluster)
            snprintf (self->nodes_dir, sizeof self->nodes_dir, "%s", args->nodes_dir);
        snprintf (self->master_key, sizeof self->master_key, "%s", zcert_public_txt (self->cert));
        if (args->master_file) {
            zcert_t *master = s_load ("--curve-master", args->master_file, why, why_size);
            if (!master) {
                kvp_curve_destroy (&self);
                return NULL;
            }
            snprintf (self->master_key, sizeof self->master_key, "%s", zcert_public_txt (master));
            zcert_destroy (&master);
        }
    }
    else if (args->cluster) {
        char path[512];
        const char *file = args->cluster_key_file;
        if (!file) {
            if (kvp_cluster_key_default (path, sizeof path) != 0) {
                snprintf (why, why_size, "no home folder for the default cluster key: give "
                                         "--cluster-key FILE");
                kvp_curve_destroy (&self);
                return NULL;
            }
            file = path;
        }
        if (s_cluster_key_load (self, file, !args->cluster_key_file, why, why_size) != 0) {
            kvp_curve_destroy (&self);
            return NULL;
        }
    }
    else
        return self; //  no door needs the handler
    self->zap = zactor_new (s_zap_actor, self);
    if (!self->zap) {
        snprintf (why, why_size, "cannot bind the ZAP handler (%s): another one runs in this "
                                 "process",
                  ZAP_ENDPOINT);
        kvp_curve_destroy (&self);
        return NULL;
    }
    return self;
}

void
kvp_curve_destroy (kvp_curve_t **self_p)
{
    kvp_curve_t *self = *self_p;
    if (!self)
        return;
    zactor_destroy (&self->zap);
    zcert_destroy (&self->cert);
    pthread_mutex_destroy (&self->ask);
    free (self);
    *self_p = NULL;
}

void
kvp_curve_stop (kvp_curve_t *self)
{
    if (self) {
        pthread_mutex_lock (&self->ask);
        zactor_destroy (&self->zap);
        pthread_mutex_unlock (&self->ask);
    }
}

void
kvp_curve_set_node (kvp_curve_t *self, const char *node_id)
{
    if (self)
        snprintf (self->node_id, sizeof self->node_id, "%s", node_id ? node_id : "");
}

bool
kvp_curve_on (const kvp_curve_t *self)
{
    return self && self->cert;
}

void
kvp_curve_server (const kvp_curve_t *self, zsock_t *sock)
{
    if (!self || !self->cert)
        return;
    zcert_apply (self->cert, sock);
    zsock_set_curve_server (sock, 1);
    //  A domain makes libzmq ask the ZAP handler for every connection.
    zsock_set_zap_domain (sock, KVP_ZAP_CLIENTS);
}

void
kvp_curve_cluster_server (const kvp_curve_t *self, zsock_t *sock)
{
    if (!self)
        return;
    if (self->cert) {
        zcert_apply (self->cert, sock);
        zsock_set_curve_server (sock, 1);
    }
    else if (*self->cluster_key)
        zsock_set_plain_server (sock, 1);
    else
        return;
    zsock_set_zap_domain (sock, KVP_ZAP_CLUSTER);
}

void
kvp_curve_cluster_client (const kvp_curve_t *self, zsock_t *sock, const char *server_key)
{
    if (!self)
        return;
    if (self->cert) {
        zcert_apply (self->cert, sock);
        zsock_set_curve_serverkey (sock, server_key && *server_key
                                             ? server_key
                                             : zcert_public_txt (self->cert));
    }
    else if (*self->cluster_key) {
        char user[KVP_USER_ID_MAX + 1];
        snprintf (user, sizeof user, "%s%s%s", CLUSTER_USER, *self->node_id ? "/" : "",
                  self->node_id);
        zsock_set_plain_username (sock, user);
        zsock_set_plain_password (sock, self->cluster_key);
    }
}

bool
kvp_curve_admitted (kvp_curve_t *self, const char *domain, const char *user_id)
{
    if (!self || !self->cert || !self->zap || !user_id || strlen (user_id) != 40)
        return true;
    pthread_mutex_lock (&self->ask);
    bool admitted = true;
    if (self->zap && zstr_sendx (self->zap, "ADMITTED", domain, user_id, NULL) == 0) {
        char *answer = zstr_recv (self->zap);
        admitted = !answer || streq (answer, "1");
        zstr_free (&answer);
    }
    pthread_mutex_unlock (&self->ask);
    return admitted;
}

void
kvp_curve_admitted_keys (kvp_curve_t *self, const char *domain, const char *const *keys,
                         size_t count, bool *admitted)
{
    for (size_t i = 0; i < count; i++)
        admitted[i] = true;
    if (!self || !self->cert || !self->zap || count == 0)
        return;
    zmsg_t *ask = zmsg_new ();
    zmsg_addstr (ask, "ADMITTED_KEYS");
    zmsg_addstr (ask, domain);
    for (size_t i = 0; i < count; i++)
        zmsg_addstr (ask, keys[i]);
    pthread_mutex_lock (&self->ask);
    if (self->zap && zmsg_send (&ask, self->zap) == 0) {
        zframe_t *answer = zframe_recv (self->zap);
        if (answer && zframe_size (answer) == count)
            for (size_t i = 0; i < count; i++)
                admitted[i] = zframe_data (answer)[i] == '1';
        zframe_destroy (&answer);
    }
    pthread_mutex_unlock (&self->ask);
    zmsg_destroy (&ask);
}

const char *
kvp_curve_dir (const kvp_curve_t *self, const char *domain)
{
    if (!self || !self->cert || !domain)
        return NULL;
    const char *dir = streq (domain, KVP_ZAP_CLUSTER) ? self->nodes_dir : self->allow_dir;
    return *dir ? dir : NULL;
}

const char *
kvp_curve_public_key (const kvp_curve_t *self)
{
    return self && self->cert ? zcert_public_txt (self->cert) : "";
}

const char *
kvp_curve_master_key (const kvp_curve_t *self)
{
    return self && self->cert ? self->master_key : "";
}

const char *
kvp_curve_cluster_key_file (const kvp_curve_t *self)
{
    return self && *self->cluster_key ? self->cluster_key_file : NULL;
}

void
kvp_curve_test (bool verbose)
{
    if (verbose)
        printf (" * curve: ");
    assert (kvp_endpoint_is_loopback ("tcp://127.0.0.1:5555"));
    assert (kvp_endpoint_is_loopback ("tcp://127.1.2.3:*"));
    assert (kvp_endpoint_is_loopback ("tcp://[::1]:5555"));
    assert (kvp_endpoint_is_loopback ("tcp://localhost:5555"));
    assert (kvp_endpoint_is_loopback ("tcp://lo:5555"));
    assert (kvp_endpoint_is_loopback ("ipc://@kvpool-1"));
    assert (kvp_endpoint_is_loopback ("inproc://x"));
    assert (!kvp_endpoint_is_loopback ("tcp://*:5555"));
    assert (!kvp_endpoint_is_loopback ("tcp://0.0.0.0:5555"));
    assert (!kvp_endpoint_is_loopback ("tcp://10.0.0.1:5555"));
    assert (!kvp_endpoint_is_loopback ("tcp://127.0.0.1.example.com:5555"));
    assert (!kvp_endpoint_is_loopback ("tcp://eth0:5555"));
    assert (!kvp_endpoint_is_loopback ("tcp://[::]:5555"));
    assert (!kvp_endpoint_is_loopback ("ws://127.0.0.1:5555"));

    //  A key pair admitted by the directory gets through; an unknown one does not.
    char dir[] = "/tmp/kvpool-curve-XXXXXX";
    assert (mkdtemp (dir));
    char server_file[128], client_file[128], secret[160];
    snprintf (server_file, sizeof server_file, "%s/server", dir);
    snprintf (client_file, sizeof client_file, "%s/allowed", dir);
    zcert_t *server = zcert_new ();
    zcert_t *client = zcert_new ();
    zcert_t *stranger = zcert_new ();
    assert (zcert_save (server, server_file) == 0);
    assert (zcert_save_public (client, client_file) == 0);
    char why[256] = "";
    snprintf (secret, sizeof secret, "%s_secret", server_file);
    //  A public certificate alone will not do (zcert_load of NAME reads NAME_secret first
    //  where there is one, so the client's public file is the test).
    kvp_trust_args_t args = {.secret_file = client_file, .allow_dir = dir};
    assert (!kvp_curve_new (&args, why, sizeof why));
    assert (strstr (why, "no secret key"));
    args.secret_file = secret;
    args.allow_dir = "/nonexistent";
    assert (!kvp_curve_new (&args, why, sizeof why));
    args.allow_dir = dir;
    kvp_curve_t *curve = kvp_curve_new (&args, why, sizeof why);
    assert (curve);
    assert (streq (kvp_curve_public_key (curve), zcert_public_txt (server)));
    assert (streq (kvp_curve_master_key (curve), zcert_public_txt (server)));
    zsock_t *router = zsock_new (ZMQ_ROUTER);
    kvp_curve_server (curve, router);
    int port = zsock_bind (router, "tcp://127.0.0.1:*");
    assert (port > 0);
    zsock_t *good = zsock_new (ZMQ_DEALER), *bad = zsock_new (ZMQ_DEALER);
    zcert_apply (client, good);
    zsock_set_curve_serverkey (good, zcert_public_txt (server));
    zcert_apply (stranger, bad);
    zsock_set_curve_serverkey (bad, zcert_public_txt (server));
    zsock_connect (bad, "tcp://127.0.0.1:%d", port);
    zsock_connect (good, "tcp://127.0.0.1:%d", port);
    zstr_send (bad, "bad");
    zstr_send (good, "good");
    zsock_set_rcvtimeo (router, 2000);
    zmsg_t *msg = zmsg_recv (router);
    assert (msg);
    char *text = zmsg_popstr (msg); //  the routing id
    zstr_free (&text);
    text = zmsg_popstr (msg);
    assert (streq (text, "good"));
    zstr_free (&text);
    zmsg_destroy (&msg);
    zsock_set_rcvtimeo (router, 300);
    assert (zmsg_recv (router) == NULL);
    zsock_destroy (&good);
    zsock_destroy (&bad);
    zsock_destroy (&router);
    kvp_curve_destroy (&curve);
    zcert_destroy (&server);
    zcert_destroy (&client);
    zcert_destroy (&stranger);
    zsys_file_delete (server_file);
    zsys_file_delete (secret);
    zsys_file_delete (client_file);
    zsys_dir_delete ("%s", dir);

    //  Without CURVE, a cluster's inner door admits whoever proves the cluster key, and
    //  nobody else; a key file others may read is refused.
    char key_dir[] = "/tmp/kvpool-ckey-XXXXXX";
    assert (mkdtemp (key_dir));
    char key_file[160];
    snprintf (key_file, sizeof key_file, "%s/sub/cluster.key", key_dir);
    kvp_trust_args_t cluster_args = {.cluster = true, .cluster_key_file = key_file};
    assert (!kvp_curve_new (&cluster_args, why, sizeof why)); //  given, and missing
    assert (kvp_cluster_key_write (key_file, why, sizeof why) == 0);
    assert (kvp_cluster_key_write (key_file, why, sizeof why) == -1); //  never over one
    chmod (key_file, 0640);
    assert (!kvp_curve_new (&cluster_args, why, sizeof why));
    assert (strstr (why, "chmod 600"));
    chmod (key_file, 0600);
    kvp_curve_t *trust = kvp_curve_new (&cluster_args, why, sizeof why);
    assert (trust);
    assert (streq (kvp_curve_cluster_key_file (trust), key_file));
    router = zsock_new (ZMQ_ROUTER);
    kvp_curve_cluster_server (trust, router);
    port = zsock_bind (router, "tcp://127.0.0.1:*");
    assert (port > 0);
    good = zsock_new (ZMQ_DEALER);
    bad = zsock_new (ZMQ_DEALER);
    zsock_t *none = zsock_new (ZMQ_DEALER);
    kvp_curve_cluster_client (trust, good, NULL);
    zsock_set_plain_username (bad, "kvpool-node");
    zsock_set_plain_password (bad, "0123456789abcdef0123456789abcdef0123456789abcdef");
    zsock_connect (bad, "tcp://127.0.0.1:%d", port);
    zsock_connect (none, "tcp://127.0.0.1:%d", port);
    zsock_connect (good, "tcp://127.0.0.1:%d", port);
    zstr_send (bad, "bad");
    zstr_send (none, "none");
    zstr_send (good, "good");
    zsock_set_rcvtimeo (router, 2000);
    msg = zmsg_recv (router);
    assert (msg);
    zframe_t *routing = zmsg_pop (msg);
    zframe_t *body = zmsg_pop (msg);
    assert (zframe_streq (body, "good"));
    assert (streq (zframe_meta (body, "User-Id"), "kvpool-node"));
    zframe_destroy (&routing);
    zframe_destroy (&body);
    zmsg_destroy (&msg);
    zsock_set_rcvtimeo (router, 300);
    assert (zmsg_recv (router) == NULL);
    zsock_destroy (&good);
    zsock_destroy (&bad);
    zsock_destroy (&none);
    zsock_destroy (&router);
    kvp_curve_destroy (&trust);
    zsys_file_delete (key_file);
    snprintf (key_file, sizeof key_file, "%s/sub", key_dir);
    zsys_dir_delete ("%s", key_file);
    zsys_dir_delete ("%s", key_dir);
    if (verbose)
        printf ("OK\n");
}
