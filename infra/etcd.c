/*  etcd.c - a client of etcd's v3 JSON gateway (etcd.h).

    Each call is one POST of a JSON body to one endpoint; its answer is one JSON object,
    except a watch's, which streams one object per event and stays open: the watch reads the
    stream as it comes (s_watch_write) and ends the transfer at the first event. A refused
    connection or an endpoint that does not answer moves on to the next endpoint; an answer
    with an error field is etcd's refusal, said in etcd_error and not tried elsewhere.
*/
#include "infra/etcd.h"

#include <curl/curl.h>
#include <cjson/cJSON.h>
#include <czmq.h>
#include <pthread.h>

struct _etcd_t {
    CURL *curl;
    char *hosts[16];
    size_t host_count;
    size_t current; //  the endpoint that answered last
    int timeout_ms;
    atomic_bool *stop;
    zarmour_t *armour;
    char error[256];
    //  the answer being read
    char *body;
    size_t body_size, body_capacity;
    bool watch_event; //  a watch saw an event (its transfer was ended on purpose)
    int64_t watch_deadline;
};

static pthread_once_t s_curl_once = PTHREAD_ONCE_INIT;

//  Plain HTTP only (s_post): no TLS library to set up, nor per-thread state of one to leak.
static void
s_curl_init (void)
{
    curl_global_init (CURL_GLOBAL_NOTHING);
}

bool
etcd_is_address (const char *url)
{
    return url && strncmp (url, "etcd://", 7) == 0;
}

int
etcd_address_parse (const char *url, etcd_address_t *address, char *error, size_t error_size)
{
    memset (address, 0, sizeof *address);
    if (!etcd_is_address (url)) {
        snprintf (error, error_size, "'%s' is not etcd://HOST:PORT[,HOST:PORT...]/CLUSTER",
                  url ? url : "");
        return -1;
    }
    const char *hosts = url + 7;
    const char *slash = strchr (hosts, '/');
    if (!slash || slash == hosts || !slash[1] || strlen (slash + 1) >= sizeof address->cluster
        || (size_t) (slash - hosts) >= sizeof address->endpoints) {
        snprintf (error, error_size,
                  "'%s': give etcd's endpoints and a cluster name: "
                  "etcd://HOST:PORT[,HOST:PORT...]/CLUSTER",
                  url);
        return -1;
    }
    for (const char *c = slash + 1; *c; c++)
        if (!isalnum ((unsigned char) *c) && !strchr ("-_.", *c)) {
            snprintf (error, error_size, "'%s': a cluster name is letters, digits, - _ and .", url);
            return -1;
        }
    memcpy (address->endpoints, hosts, (size_t) (slash - hosts));
    snprintf (address->cluster, sizeof address->cluster, "%s", slash + 1);
    return 0;
}

etcd_t *
etcd_new (const char *endpoints, int timeout_ms)
{
    pthread_once (&s_curl_once, s_curl_init);
    etcd_t *self = (etcd_t *) zmalloc (sizeof (etcd_t));
    self->curl = curl_easy_init ();
    self->armour = zarmour_new ();
    assert (self->curl && self->armour);
    zarmour_set_line_breaks (self->armour, false);
    self->timeout_ms = timeout_ms;
    char *list = strdup (endpoints);
    char *save = NULL;
    for (char *host = strtok_r (list, ",", &save); host && self->host_count < 16;
         host = strtok_r (NULL, ",", &save))
        self->hosts[self->host_count++] = strdup (host);
    free (list);
    return self;
}

void
etcd_destroy (etcd_t **self_p)
{
    etcd_t *self = *self_p;
    if (!self)
        return;
    curl_easy_cleanup (self->curl);
    zarmour_destroy (&self->armour);
    for (size_t i = 0; i < self->host_count; i++)
        free (self->hosts[i]);
    free (self->body);
    free (self);
    *self_p = NULL;
}

void
etcd_set_stop (etcd_t *self, atomic_bool *stop)
{
    self->stop = stop;
}

const char *
etcd_error (etcd_t *self)
{
    return self->error;
}

static void
s_fail (etcd_t *self, const char *format, ...)
{
    va_list args;
    va_start (args, format);
    vsnprintf (self->error, sizeof self->error, format, args);
    va_end (args);
}

static size_t
s_write (char *data, size_t size, size_t count, void *arg)
{
    etcd_t *self = (etcd_t *) arg;
    size_t bytes = size * count;
    if (self->body_size + bytes + 1 > self->body_capacity) {
        size_t capacity = (self->body_size + bytes + 1) * 2;
        if (capacity > (64u << 20))
            return 0; //  an answer this large is not etcd's to us
        char *body = (char *) realloc (self->body, capacity);
        if (!body)
            return 0;
        self->body = body;
        self->body_capacity = capacity;
    }
    memcpy (self->body + self->body_size, data, bytes);
    self->body_size += bytes;
    self->body[self->body_size] = 0;
    return bytes;
}

//  A watch's stream: the first object is the watch's creation, any later one with events is
//  what we wait for: the transfer ends there (returning short fails it on purpose).
static size_t
s_watch_write (char *data, size_t size, size_t count, void *arg)
{
    etcd_t *self = (etcd_t *) arg;
    size_t bytes = s_write (data, size, count, arg);
    if (bytes && strstr (self->body, "\"events\"")) {
        self->watch_event = true;
        return 0;
    }
    return bytes;
}

static int
s_progress (void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow)
{
    (void) dltotal, (void) dlnow, (void) ultotal, (void) ulnow;
    etcd_t *self = (etcd_t *) arg;
    if (self->stop && atomic_load (self->stop))
        return 1;
    return self->watch_deadline && zclock_mono () >= self->watch_deadline;
}

//  POSTs body to path at one endpoint after another until one answers. Returns the answer
//  parsed (caller owns it), or NULL (etcd_error says why). A watch (watch_ms > 0) returns
//  NULL with watch_event set when its key changed.
static cJSON *
s_post (etcd_t *self, const char *path, const char *body, int watch_ms)
{
    self->error[0] = 0;
    self->watch_event = false;
    for (size_t tried = 0; tried < self->host_count; tried++) {
        if (self->stop && atomic_load (self->stop)) {
            s_fail (self, "stopped");
            return NULL;
        }
        size_t host = (self->current + tried) % self->host_count;
        char url[600];
        snprintf (url, sizeof url, "http://%s%s", self->hosts[host], path);
        self->body_size = 0;
        if (self->body)
            self->body[0] = 0;
        CURL *curl = self->curl;
        curl_easy_reset (curl);
        curl_easy_setopt (curl, CURLOPT_URL, url);
        curl_easy_setopt (curl, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt (curl, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt (curl, CURLOPT_CONNECTTIMEOUT_MS, (long) self->timeout_ms);
        curl_easy_setopt (curl, CURLOPT_WRITEDATA, self);
        curl_easy_setopt (curl, CURLOPT_NOPROXY, "*");
        curl_easy_setopt (curl, CURLOPT_XFERINFOFUNCTION, s_progress);
        curl_easy_setopt (curl, CURLOPT_XFERINFODATA, self);
        curl_easy_setopt (curl, CURLOPT_NOPROGRESS, 0L);
        if (watch_ms > 0) {
            curl_easy_setopt (curl, CURLOPT_WRITEFUNCTION, s_watch_write);
            self->watch_deadline = zclock_mono () + watch_ms;
        }
        else {
            curl_easy_setopt (curl, CURLOPT_WRITEFUNCTION, s_write);
            curl_easy_setopt (curl, CURLOPT_TIMEOUT_MS, (long) self->timeout_ms);
            self->watch_deadline = 0;
        }
        CURLcode rc = curl_easy_perform (curl);
        if (watch_ms > 0 && (self->watch_event || rc == CURLE_ABORTED_BY_CALLBACK)) {
            self->current = host;
            return NULL; //  an event, the wait's end or a stop: not a failure
        }
        if (rc != CURLE_OK) {
            s_fail (self, "etcd at %s: %s", self->hosts[host], curl_easy_strerror (rc));
            continue;
        }
        long code = 0;
        curl_easy_getinfo (curl, CURLINFO_RESPONSE_CODE, &code);
        cJSON *answer = self->body ? cJSON_Parse (self->body) : NULL;
        if (!answer) {
            s_fail (self, "etcd at %s answered %ld, not JSON", self->hosts[host], code);
            continue;
        }
        self->current = host;
        cJSON *error = cJSON_GetObjectItemCaseSensitive (answer, "error");
        if (code != 200 || error) {
            s_fail (self, "etcd at %s: %s", self->hosts[host],
                    cJSON_IsString (error) ? error->valuestring : "refused");
            cJSON_Delete (answer);
            return NULL;
        }
        return answer;
    }
    return NULL;
}

//  A 64-bit number as the gateway writes it (a string), or as a plain JSON number.
static int64_t
s_int (const cJSON *object, const char *name)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive (object, name);
    if (cJSON_IsString (item))
        return strtoll (item->valuestring, NULL, 10);
    if (cJSON_IsNumber (item))
        return (int64_t) item->valuedouble;
    return 0;
}

static char *
s_encode (etcd_t *self, const char *text)
{
    return zarmour_encode (self->armour, (const byte *) text, strlen (text));
}

//  kv's fields from one of the answer's kvs; its value decoded (cut to fit).
static void
s_kv_read (etcd_t *self, const cJSON *item, etcd_kv_t *kv)
{
    kv->create_revision = s_int (item, "create_revision");
    kv->mod_revision = s_int (item, "mod_revision");
    kv->lease = s_int (item, "lease");
    kv->value[0] = 0;
    const cJSON *value = cJSON_GetObjectItemCaseSensitive (item, "value");
    if (cJSON_IsString (value)) {
        zchunk_t *chunk = zarmour_decode (self->armour, value->valuestring);
        if (chunk) {
            size_t size = zchunk_size (chunk) < sizeof kv->value - 1 ? zchunk_size (chunk)
                                                                     : sizeof kv->value - 1;
            memcpy (kv->value, zchunk_data (chunk), size);
            kv->value[size] = 0;
            zchunk_destroy (&chunk);
        }
    }
}

static int64_t
s_header_revision (const cJSON *answer)
{
    return s_int (cJSON_GetObjectItemCaseSensitive (answer, "header"), "revision");
}

int
etcd_lease_grant (etcd_t *self, int ttl_s, int64_t *id)
{
    char body[64];
    snprintf (body, sizeof body, "{\"TTL\":\"%d\"}", ttl_s);
    cJSON *answer = s_post (self, "/v3/lease/grant", body, 0);
    if (!answer)
        return -1;
    *id = s_int (answer, "ID");
    cJSON_Delete (answer);
    if (*id == 0) {
        s_fail (self, "etcd granted no lease");
        return -1;
    }
    return 0;
}

//  A call about lease id (keepalive, revoke): its answer, or NULL.
static cJSON *
s_lease_post (etcd_t *self, const char *path, int64_t id)
{
    char body[64];
    snprintf (body, sizeof body, "{\"ID\":\"%lld\"}", (long long) id);
    return s_post (self, path, body, 0);
}

int
etcd_lease_keepalive (etcd_t *self, int64_t id, int64_t *ttl_s)
{
    cJSON *answer = s_lease_post (self, "/v3/lease/keepalive", id);
    if (!answer)
        return -1;
    //  An expired lease is answered with no TTL at all (0).
    *ttl_s = s_int (cJSON_GetObjectItemCaseSensitive (answer, "result"), "TTL");
    cJSON_Delete (answer);
    return 0;
}

int
etcd_lease_revoke (etcd_t *self, int64_t id)
{
    cJSON *answer = s_lease_post (self, "/v3/lease/revoke", id);
    if (!answer)
        return -1;
    cJSON_Delete (answer);
    return 0;
}

int
etcd_create (etcd_t *self, const char *key, const char *value, int64_t lease, bool *won,
             etcd_kv_t *kv)
{
    char *k = s_encode (self, key), *v = s_encode (self, value);
    char *body = zsys_sprintf (
        "{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\",\"createRevision\":\"0\"}],"
        "\"success\":[{\"requestPut\":{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%lld\"}}],"
        "\"failure\":[{\"requestRange\":{\"key\":\"%s\"}}]}",
        k, k, v, (long long) lease, k);
    free (k);
    free (v);
    cJSON *answer = s_post (self, "/v3/kv/txn", body, 0);
    zstr_free (&body);
    if (!answer)
        return -1;
    memset (kv, 0, sizeof *kv);
    kv->revision = s_header_revision (answer);
    *won = cJSON_IsTrue (cJSON_GetObjectItemCaseSensitive (answer, "succeeded"));
    if (*won) {
        //  Created in this transaction: its revision is the store's now.
        kv->create_revision = kv->mod_revision = kv->revision;
        kv->lease = lease;
        snprintf (kv->value, sizeof kv->value, "%s", value);
    }
    else {
        const cJSON *responses = cJSON_GetObjectItemCaseSensitive (answer, "responses");
        const cJSON *range =
            cJSON_GetObjectItemCaseSensitive (cJSON_GetArrayItem (responses, 0), "response_range");
        const cJSON *kvs = cJSON_GetObjectItemCaseSensitive (range, "kvs");
        if (cJSON_GetArraySize (kvs) > 0)
            s_kv_read (self, cJSON_GetArrayItem (kvs, 0), kv);
    }
    cJSON_Delete (answer);
    return 0;
}

int
etcd_put (etcd_t *self, const char *key, const char *value)
{
    char *k = s_encode (self, key), *v = s_encode (self, value);
    char *body = zsys_sprintf ("{\"key\":\"%s\",\"value\":\"%s\"}", k, v);
    free (k);
    free (v);
    cJSON *answer = s_post (self, "/v3/kv/put", body, 0);
    zstr_free (&body);
    if (!answer)
        return -1;
    cJSON_Delete (answer);
    return 0;
}

int
etcd_get (etcd_t *self, const char *key, etcd_kv_t *kv)
{
    char *k = s_encode (self, key);
    char *body = zsys_sprintf ("{\"key\":\"%s\"}", k);
    free (k);
    cJSON *answer = s_post (self, "/v3/kv/range", body, 0);
    zstr_free (&body);
    if (!answer)
        return -1;
    memset (kv, 0, sizeof *kv);
    kv->revision = s_header_revision (answer);
    const cJSON *kvs = cJSON_GetObjectItemCaseSensitive (answer, "kvs");
    if (cJSON_GetArraySize (kvs) > 0)
        s_kv_read (self, cJSON_GetArrayItem (kvs, 0), kv);
    cJSON_Delete (answer);
    return 0;
}

int
etcd_get_prefix (etcd_t *self, const char *prefix, etcd_each_fn *fn, void *arg)
{
    //  Every key from prefix up to (not including) prefix with its last byte raised by one.
    size_t length = strlen (prefix);
    assert (length > 0 && (unsigned char) prefix[length - 1] < 0xff);
    char *end = strdup (prefix);
    end[length - 1]++;
    char *k = s_encode (self, prefix), *e = s_encode (self, end);
    free (end);
    char *body = zsys_sprintf ("{\"key\":\"%s\",\"range_end\":\"%s\"}", k, e);
    free (k);
    free (e);
    cJSON *answer = s_post (self, "/v3/kv/range", body, 0);
    zstr_free (&body);
    if (!answer)
        return -1;
    const cJSON *kvs = cJSON_GetObjectItemCaseSensitive (answer, "kvs");
    int count = 0;
    const cJSON *item;
    cJSON_ArrayForEach (item, kvs)
    {
        etcd_kv_t kv;
        s_kv_read (self, item, &kv);
        const cJSON *key = cJSON_GetObjectItemCaseSensitive (item, "key");
        zchunk_t *name =
            cJSON_IsString (key) ? zarmour_decode (self->armour, key->valuestring) : NULL;
        if (name) {
            char *text = zchunk_strdup (name);
            fn (text, kv.value, arg);
            free (text);
            zchunk_destroy (&name);
            count++;
        }
    }
    cJSON_Delete (answer);
    return count;
}

int
etcd_delete (etcd_t *self, const char *key, int64_t create_revision)
{
    char *k = s_encode (self, key);
    char *body = create_revision > 0
                     ? zsys_sprintf ("{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\","
                                     "\"createRevision\":\"%lld\"}],"
                                     "\"success\":[{\"requestDeleteRange\":{\"key\":\"%s\"}}]}",
                                     k, (long long) create_revision, k)
                     : zsys_sprintf ("{\"key\":\"%s\"}", k);
    free (k);
    cJSON *answer =
        s_post (self, create_revision > 0 ? "/v3/kv/txn" : "/v3/kv/deleterange", body, 0);
    zstr_free (&body);
    if (!answer)
        return -1;
    cJSON_Delete (answer);
    return 0;
}

int
etcd_watch (etcd_t *self, const char *key, int64_t revision, int wait_ms)
{
    char *k = s_encode (self, key);
    char *body = zsys_sprintf ("{\"create_request\":{\"key\":\"%s\",\"start_revision\":\"%lld\"}}",
                               k, (long long) revision + 1);
    free (k);
    cJSON *answer = s_post (self, "/v3/watch", body, wait_ms);
    zstr_free (&body);
    if (self->watch_event)
        return 1;
    if (answer) { //  etcd ended the watch (canceled, compacted): read the key again
        cJSON_Delete (answer);
        return 1;
    }
    return self->error[0] ? -1 : 0;
}

//  ---- self test ---------------------------------------------------------------------
//  (Talking to a real etcd is tests/python/test_ha.py's part.)

void
etcd_test (bool verbose)
{
    (void) verbose;
    printf (" * etcd: ");
    etcd_address_t address;
    char error[256];
    assert (etcd_address_parse ("etcd://127.0.0.1:2379,10.0.0.2:2379/prod-1", &address, error,
                                sizeof error)
            == 0);
    assert (streq (address.endpoints, "127.0.0.1:2379,10.0.0.2:2379"));
    assert (streq (address.cluster, "prod-1"));
    assert (etcd_address_parse ("tcp://127.0.0.1:2379", &address, error, sizeof error) == -1);
    assert (etcd_address_parse ("etcd://127.0.0.1:2379", &address, error, sizeof error) == -1);
    assert (etcd_address_parse ("etcd:///c", &address, error, sizeof error) == -1);
    assert (etcd_address_parse ("etcd://h:1/a/b", &address, error, sizeof error) == -1);
    assert (strstr (error, "cluster name"));
    //  Nobody listens: each call fails, says why, and takes no longer than its timeout.
    etcd_t *etcd = etcd_new ("127.0.0.1:1", 200);
    etcd_kv_t kv;
    int64_t start = zclock_mono ();
    assert (etcd_get (etcd, "/kvpool/x/leader", &kv) == -1);
    assert (strstr (etcd_error (etcd), "127.0.0.1:1"));
    assert (etcd_watch (etcd, "/kvpool/x/leader", 1, 100) == -1);
    assert (zclock_mono () - start < 2000);
    atomic_bool stop = true;
    etcd_set_stop (etcd, &stop);
    int64_t id;
    assert (etcd_lease_grant (etcd, 3, &id) == -1);
    assert (streq (etcd_error (etcd), "stopped"));
    etcd_destroy (&etcd);
    assert (etcd == NULL);
    printf ("OK\n");
}
