/*  curve.c - CURVE authentication and encryption of kvpoold's ZeroMQ sockets (curve.h).

    The ZAP handler is CZMQ's zauth, one per process, on CZMQ's context, where every socket
    of the node lives. It admits a CURVE client whose public key is in a certificate in the
    allow directory; zcertstore reads the directory again on a lookup after it changed.
*/
#include "actors/curve.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "actors/endpoints.h"
#include "actors/log.h"

//  zcert's secret key of a certificate loaded from a public file: all zero bytes.
#define NO_SECRET "0000000000000000000000000000000000000000"

struct _kvp_curve_t {
    zcert_t *cert;
    zactor_t *auth;
    char master_key[41];
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

kvp_curve_t *
kvp_curve_new (const char *secret_file, const char *allow_dir, const char *master_file, char *why,
               size_t why_size)
{
    struct stat st;
    errno = 0;
    if (!allow_dir || stat (allow_dir, &st) != 0 || !S_ISDIR (st.st_mode)) {
        snprintf (why, why_size, "--curve-allow %s: %s", allow_dir ? allow_dir : "(not set)",
                  allow_dir && errno ? strerror (errno) : "not a directory");
        return NULL;
    }
    zcert_t *cert = s_load ("--curve-secret", secret_file, why, why_size);
    if (!cert)
        return NULL;
    if (!strcmp (zcert_secret_txt (cert), NO_SECRET)) {
        snprintf (why, why_size,
                  "--curve-secret %s holds no secret key: give the NAME_secret file that "
                  "kvpool keygen NAME wrote",
                  secret_file);
        zcert_destroy (&cert);
        return NULL;
    }
    kvp_curve_t *self = (kvp_curve_t *) zmalloc (sizeof (kvp_curve_t));
    self->cert = cert;
    snprintf (self->master_key, sizeof self->master_key, "%s", zcert_public_txt (cert));
    if (master_file) {
        zcert_t *master = s_load ("--curve-master", master_file, why, why_size);
        if (!master) {
            kvp_curve_destroy (&self);
            return NULL;
        }
        snprintf (self->master_key, sizeof self->master_key, "%s", zcert_public_txt (master));
        zcert_destroy (&master);
    }
    self->auth = zactor_new (zauth, NULL);
    assert (self->auth);
    zstr_sendx (self->auth, "CURVE", allow_dir, NULL);
    zsock_wait (self->auth);
    return self;
}

void
kvp_curve_destroy (kvp_curve_t **self_p)
{
    kvp_curve_t *self = *self_p;
    if (!self)
        return;
    zactor_destroy (&self->auth);
    zcert_destroy (&self->cert);
    free (self);
    *self_p = NULL;
}

void
kvp_curve_server (const kvp_curve_t *self, zsock_t *sock)
{
    if (!self)
        return;
    zcert_apply (self->cert, sock);
    zsock_set_curve_server (sock, 1);
    //  A domain makes libzmq ask the ZAP handler for every connection.
    zsock_set_zap_domain (sock, "kvpool");
}

void
kvp_curve_client (const kvp_curve_t *self, zsock_t *sock, const char *server_key)
{
    if (!self)
        return;
    zcert_apply (self->cert, sock);
    zsock_set_curve_serverkey (sock, server_key && *server_key ? server_key
                                                               : zcert_public_txt (self->cert));
}

void
kvp_curve_stop (kvp_curve_t *self)
{
    if (self)
        zactor_destroy (&self->auth);
}

const char *
kvp_curve_public_key (const kvp_curve_t *self)
{
    return self ? zcert_public_txt (self->cert) : "";
}

const char *
kvp_curve_master_key (const kvp_curve_t *self)
{
    return self ? self->master_key : "";
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
    assert (!kvp_curve_new (client_file, dir, NULL, why, sizeof why));
    assert (strstr (why, "no secret key"));
    assert (!kvp_curve_new (secret, "/nonexistent", NULL, why, sizeof why));
    kvp_curve_t *curve = kvp_curve_new (secret, dir, NULL, why, sizeof why);
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
    if (verbose)
        printf ("OK\n");
}
