/*  endpoints.c - the ENDPOINTS pipe command (see endpoints.h). */
#include "infra/endpoints.h"

void
kvp_endpoint_resolved (const char *endpoint, int port, char *out, size_t size)
{
    size_t len = strlen (endpoint);
    if (len >= 2 && streq (endpoint + len - 2, ":*"))
        snprintf (out, size, "%.*s:%d", (int) (len - 2), endpoint, port);
    else
        snprintf (out, size, "%s", endpoint);
}

int
kvp_endpoints_reply (zsock_t *pipe, zlistx_t *endpoints, const char *error)
{
    zmsg_t *reply = zmsg_new ();
    if (error && *error) {
        zmsg_addstr (reply, "ERROR");
        zmsg_addstr (reply, error);
    }
    else {
        zmsg_addstr (reply, "OK");
        for (char *endpoint = (char *) zlistx_first (endpoints); endpoint;
             endpoint = (char *) zlistx_next (endpoints))
            zmsg_addstr (reply, endpoint);
    }
    return zmsg_send (&reply, pipe);
}

zlist_t *
kvp_endpoints_ask (zactor_t *actor, const char *what)
{
    zstr_send (actor, "ENDPOINTS");
    zmsg_t *reply = zmsg_recv (actor);
    char *status = reply ? zmsg_popstr (reply) : NULL;
    zlist_t *endpoints = NULL;
    if (status && streq (status, "OK")) {
        endpoints = zlist_new ();
        zlist_autofree (endpoints);
        char *endpoint;
        while ((endpoint = zmsg_popstr (reply))) {
            zlist_append (endpoints, endpoint);
            zstr_free (&endpoint);
        }
    }
    else {
        char *reason = reply ? zmsg_popstr (reply) : NULL;
        fprintf (stderr, "kvpoold: %s: %s\n", what, reason ? reason : "no answer");
        zstr_free (&reason);
    }
    zstr_free (&status);
    zmsg_destroy (&reply);
    return endpoints;
}

bool
kvp_endpoint_is_wildcard (const char *endpoint)
{
    if (!endpoint || strncmp (endpoint, "tcp://", 6) != 0)
        return false;
    const char *host = endpoint + 6;
    const char *colon = strrchr (host, ':');
    size_t len = colon ? (size_t) (colon - host) : strlen (host);
    return (len == 1 && host[0] == '*') || (len == 7 && !strncmp (host, "0.0.0.0", 7))
           || (len == 2 && !strncmp (host, "::", 2)) || (len == 4 && !strncmp (host, "[::]", 4));
}

int
kvp_endpoint_advertised (const char *endpoint, const char *advertise, char *out, size_t size)
{
    if (!kvp_endpoint_is_wildcard (endpoint)) {
        snprintf (out, size, "%s", endpoint ? endpoint : "");
        return 0;
    }
    if (!advertise || !*advertise) {
        snprintf (out, size, "%s", "");
        return -1;
    }
    const char *port = strrchr (endpoint + 6, ':');
    bool bare_ipv6 = strchr (advertise, ':') && advertise[0] != '[';
    snprintf (out, size, bare_ipv6 ? "tcp://[%s]%s" : "tcp://%s%s", advertise, port ? port : "");
    return 0;
}

bool
kvp_endpoint_is_loopback (const char *endpoint)
{
    if (!endpoint)
        return true;
    if (!strncmp (endpoint, "ipc://", 6) || !strncmp (endpoint, "inproc://", 9))
        return true;
    if (strncmp (endpoint, "tcp://", 6) != 0)
        return false;
    const char *host = endpoint + 6;
    const char *colon = strrchr (host, ':');
    size_t len = colon ? (size_t) (colon - host) : strlen (host);
    if (len == 5 && !strncmp (host, "[::1]", 5))
        return true;
    if ((len == 9 && !strncmp (host, "localhost", 9)) || (len == 2 && !strncmp (host, "lo", 2)))
        return true;
    if (len >= 4 && len <= 15 && !strncmp (host, "127.", 4)) {
        for (size_t i = 4; i < len; i++)
            if (host[i] != '.' && (host[i] < '0' || host[i] > '9'))
                return false;
        return true;
    }
    return false;
}
