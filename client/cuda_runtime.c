/*  cuda_runtime.c - finding and loading the CUDA runtime (cuda_runtime.h).

    One finder per process context. Looking is cheap and repeated while there is nothing to
    find: in automatic mode the runtime is looked for only once libcuda.so.1 is in the
    process, and the loader's count of objects added tells whether anything was loaded since
    it was last found absent. Loading happens once, under the finder's lock; afterwards every
    question is an atomic load.
*/
#include "client/cuda_runtime.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { S_MODE_AUTO, S_MODE_NAMED, S_MODE_OFF };

struct _kvpc_cuda_t {
    pthread_mutex_t lock;
    int mode;
    char named[512]; //  KVPOOL_CUDART in named mode
    bool load_tried; //  under lock: the runtime was looked for (once)
    kvpc_cudart_t runtime;
    atomic_bool ok;   //  runtime is bound
    atomic_bool dead; //  the runtime said this process has no working CUDA
    //  libcuda.so.1 was seen in the process; else the loader's count of objects added when it
    //  was last found absent (it is looked for again only once something new was loaded).
    atomic_bool cuda_seen;
    atomic_ullong adds_checked;
    //  The driver's cuPointerGetAttribute, looked up on first need: 0 not yet, 1 found, -1 none.
    kvpc_cuda_range_fn *_Atomic range_query;
    atomic_int range_state;
};

kvpc_cuda_t *
kvpc_cuda_new (void)
{
    kvpc_cuda_t *self = calloc (1, sizeof *self);
    if (!self)
        return NULL;
    pthread_mutex_init (&self->lock, NULL);
    const char *env = getenv ("KVPOOL_CUDART");
    if (!env)
        self->mode = S_MODE_AUTO;
    else if (!*env || strcmp (env, "0") == 0 || strcasecmp (env, "none") == 0
             || strcasecmp (env, "off") == 0)
        self->mode = S_MODE_OFF;
    else {
        self->mode = S_MODE_NAMED;
        snprintf (self->named, sizeof self->named, "%s", env);
    }
    return self;
}

void
kvpc_cuda_destroy (kvpc_cuda_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    pthread_mutex_destroy (&(*self_p)->lock);
    free (*self_p);
    *self_p = NULL;
}

static bool
s_bind (kvpc_cudart_t *rt, void *handle, const char *path)
{
    memset (rt, 0, sizeof *rt);
#define S_BIND(field, name)                                                                        \
    if (!(*(void **) &rt->field = dlsym (handle, name)))                                           \
        return false;
    S_BIND (pointer_get_attributes, "cudaPointerGetAttributes");
    S_BIND (host_alloc, "cudaHostAlloc");
    S_BIND (free_host, "cudaFreeHost");
    S_BIND (memcpy_async, "cudaMemcpyAsync");
    S_BIND (stream_create, "cudaStreamCreate");
    S_BIND (stream_synchronize, "cudaStreamSynchronize");
    S_BIND (stream_destroy, "cudaStreamDestroy");
    S_BIND (event_create, "cudaEventCreateWithFlags");
    S_BIND (event_record, "cudaEventRecord");
    S_BIND (event_synchronize, "cudaEventSynchronize");
    S_BIND (event_destroy, "cudaEventDestroy");
    S_BIND (get_device, "cudaGetDevice");
    S_BIND (set_device, "cudaSetDevice");
    S_BIND (get_last_error, "cudaGetLastError");
    S_BIND (get_error_string, "cudaGetErrorString");
#undef S_BIND
    kvpc_cuda_error_t (*get_version) (int *) = NULL;
    *(void **) &get_version = dlsym (handle, "cudaRuntimeGetVersion");
    //  Older runtimes lay cudaPointerAttributes out otherwise.
    if (!get_version || get_version (&rt->version) != 0 || rt->version < 11000)
        return false;
    //  Optional: registering the node's segments (direct DMA), and batches of copies.
    *(void **) &rt->host_register = dlsym (handle, "cudaHostRegister");
    *(void **) &rt->host_unregister = dlsym (handle, "cudaHostUnregister");
    if (!rt->host_register || !rt->host_unregister) {
        rt->host_register = NULL;
        rt->host_unregister = NULL;
    }
    *(void **) &rt->memcpy_2d = dlsym (handle, "cudaMemcpy2DAsync");
    if (rt->version >= 13000)
        *(void **) &rt->memcpy_batch = dlsym (handle, "cudaMemcpyBatchAsync");
    rt->handle = handle;
    snprintf (rt->path, sizeof rt->path, "%s", path);
    return true;
}

//  Binds the runtime (the lock held). A handle that does not bind is closed; one that does
//  stays open for good (cuda_runtime.h says why).
static void
s_load (kvpc_cuda_t *self)
{
    if (self->mode == S_MODE_NAMED) {
        void *handle = dlopen (self->named, RTLD_NOW | RTLD_LOCAL);
        if (handle && s_bind (&self->runtime, handle, self->named))
            atomic_store (&self->ok, true);
        else if (handle)
            dlclose (handle);
        return;
    }
    //  The application's own runtime first (PyTorch's, say), then one from the library path.
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                        "libcudart.so"};
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            void *handle = dlopen (names[i], RTLD_NOW | RTLD_LOCAL | (pass ? 0 : RTLD_NOLOAD));
            if (!handle)
                continue;
            Dl_info info;
            const char *path = names[i];
            void *symbol = dlsym (handle, "cudaRuntimeGetVersion");
            if (symbol && dladdr (symbol, &info) && info.dli_fname)
                path = info.dli_fname;
            if (s_bind (&self->runtime, handle, path)) {
                atomic_store (&self->ok, true);
                return;
            }
            dlclose (handle);
        }
}

static int
s_adds (struct dl_phdr_info *info, size_t size, void *arg)
{
    if (size >= offsetof (struct dl_phdr_info, dlpi_adds) + sizeof info->dlpi_adds)
        *(unsigned long long *) arg = info->dlpi_adds;
    return 1; //  the first object says it
}

//  Whether the CUDA driver is in the process: only then can a buffer be device memory.
static bool
s_cuda_in_process (kvpc_cuda_t *self)
{
    if (atomic_load_explicit (&self->cuda_seen, memory_order_relaxed))
        return true;
    unsigned long long adds = 0;
    dl_iterate_phdr (s_adds, &adds);
    if (adds != 0 && adds == atomic_load_explicit (&self->adds_checked, memory_order_relaxed))
        return false;
    void *driver = dlopen ("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
    if (driver) {
        dlclose (driver);
        atomic_store (&self->cuda_seen, true);
        return true;
    }
    atomic_store_explicit (&self->adds_checked, adds, memory_order_relaxed);
    return false;
}

const kvpc_cudart_t *
kvpc_cuda_get (kvpc_cuda_t *self)
{
    if (self->mode == S_MODE_OFF || atomic_load_explicit (&self->dead, memory_order_relaxed))
        return NULL;
    if (atomic_load_explicit (&self->ok, memory_order_acquire))
        return &self->runtime;
    if (self->mode == S_MODE_AUTO && !s_cuda_in_process (self))
        return NULL;
    pthread_mutex_lock (&self->lock);
    if (!self->load_tried) {
        self->load_tried = true;
        s_load (self);
    }
    pthread_mutex_unlock (&self->lock);
    return atomic_load_explicit (&self->ok, memory_order_acquire) ? &self->runtime : NULL;
}

void
kvpc_cuda_mark_dead (kvpc_cuda_t *self)
{
    atomic_store (&self->dead, true);
}

bool
kvpc_cuda_dead (kvpc_cuda_t *self)
{
    return atomic_load_explicit (&self->dead, memory_order_relaxed);
}

kvpc_cuda_range_fn *
kvpc_cuda_range_query (kvpc_cuda_t *self)
{
    int state = atomic_load_explicit (&self->range_state, memory_order_acquire);
    if (state)
        return state > 0 ? atomic_load (&self->range_query) : NULL;
    void *fn = dlsym (self->runtime.handle, "cuPointerGetAttribute");
    if (!fn) {
        void *driver = dlopen ("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
        if (driver)
            fn = dlsym (driver, "cuPointerGetAttribute"); //  stays loaded: the runtime uses it
    }
    atomic_store (&self->range_query, (kvpc_cuda_range_fn *) fn);
    atomic_store_explicit (&self->range_state, fn ? 1 : -1, memory_order_release);
    return (kvpc_cuda_range_fn *) fn;
}

const char *
kvpc_cuda_path (kvpc_cuda_t *self)
{
    return atomic_load_explicit (&self->ok, memory_order_acquire) ? self->runtime.path : "";
}
