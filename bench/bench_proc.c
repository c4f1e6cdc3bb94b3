/*  bench_proc.c - the processes and scratch files of kvpool-bench (see bench.h).

    The sections start their own servers: kvpool_bench.c one kvpoold and redis-server for the
    kv, exist and lookup sections, bench_tier.c a kvpoold per setting it measures. All of them
    are started here, so one list knows every child the bench has running: an interrupted
    bench (SIGINT, SIGTERM: bench_on_signal) stops them and removes the scratch directory
    before it exits, and a bench that dies anyway takes them with it (PR_SET_PDEATHSIG).

    The list and the scratch path are written by the main thread only and read by the signal
    handler, which uses async-signal-safe calls only (kill, waitpid, nanosleep, fork, execv):
    the directory is removed by /bin/rm in a child, as nftw may not run in a handler.
*/
#include "bench/bench.h"
#include "infra/ready_file.h"

#include <arpa/inet.h>
#include <math.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CHILDREN 16
#define READY_TIMEOUT_MS 20000
//  How long a started kvpoold may take to fault its segments in (s_settle), and how often
//  its mapped memory is looked at meanwhile.
#define SETTLE_MAX_MS 60000
#define SETTLE_STEP_MS 300

static volatile pid_t s_children[MAX_CHILDREN];
static char s_scratch[256]; //  "" when there is none
static volatile sig_atomic_t s_scratch_set;

double
bench_now (void)
{
    struct timespec ts;
    clock_gettime (CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void
bench_sleep_ms (int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep (&ts, NULL);
}

static void
s_remember (pid_t pid)
{
    for (int i = 0; i < MAX_CHILDREN; i++)
        if (s_children[i] == 0) {
            s_children[i] = pid;
            return;
        }
    //  More children than slots: PR_SET_PDEATHSIG still stops this one when the bench ends.
}

static void
s_forget (pid_t pid)
{
    for (int i = 0; i < MAX_CHILDREN; i++)
        if (s_children[i] == pid)
            s_children[i] = 0;
}

pid_t
bench_spawn (const char *const *argv, const char *log)
{
    pid_t parent = getpid ();
    pid_t pid = fork ();
    if (pid > 0)
        s_remember (pid);
    if (pid != 0)
        return pid;
    prctl (PR_SET_PDEATHSIG, SIGTERM);
    if (getppid () != parent)
        _exit (127);
    int null = open ("/dev/null", O_RDONLY);
    int out = open (log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (null >= 0)
        dup2 (null, 0);
    if (out >= 0) {
        dup2 (out, 1);
        dup2 (out, 2);
    }
    execv (argv[0], (char *const *) argv);
    fprintf (stderr, "exec %s: %s\n", argv[0], strerror (errno));
    _exit (127);
}

int
bench_stop (pid_t pid)
{
    if (pid <= 0)
        return 0;
    kill (pid, SIGTERM);
    int status;
    double deadline = bench_now () + 10;
    while (bench_now () < deadline) {
        pid_t done = waitpid (pid, &status, WNOHANG);
        if (done == pid) {
            s_forget (pid);
            return WIFEXITED (status) ? WEXITSTATUS (status) : 128 + WTERMSIG (status);
        }
        if (done < 0) {
            s_forget (pid);
            return -1;
        }
        bench_sleep_ms (10);
    }
    kill (pid, SIGKILL);
    waitpid (pid, &status, 0);
    s_forget (pid);
    return -1;
}

int
bench_wait (pid_t pid)
{
    int status;
    pid_t done;
    while ((done = waitpid (pid, &status, 0)) < 0 && errno == EINTR)
        ;
    s_forget (pid);
    if (done != pid)
        return -1;
    return WIFEXITED (status) ? WEXITSTATUS (status) : 128 + WTERMSIG (status);
}

bool
bench_exited (pid_t pid)
{
    int status;
    if (waitpid (pid, &status, WNOHANG) != pid)
        return false;
    s_forget (pid);
    return true;
}

//  redis-server and iperf3 cannot bind port 0 and say which port they got: the bench picks
//  one here, and retries when another process took it meanwhile.
int
bench_free_port (void)
{
    int fd = socket (AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
    addr.sin_addr.s_addr = htonl (INADDR_LOOPBACK);
    socklen_t length = sizeof addr;
    int port = -1;
    if (bind (fd, (struct sockaddr *) &addr, sizeof addr) == 0
        && getsockname (fd, (struct sockaddr *) &addr, &length) == 0)
        port = ntohs (addr.sin_port);
    close (fd);
    return port;
}

uint64_t
bench_proc_status_bytes (pid_t pid, const char *field)
{
    char path[64], line[256];
    snprintf (path, sizeof path, "/proc/%d/status", (int) pid);
    FILE *status = fopen (path, "r");
    size_t length = strlen (field);
    unsigned long long kib = 0;
    while (status && fgets (line, sizeof line, status))
        if (!strncmp (line, field, length) && line[length] == ':') {
            kib = strtoull (line + length + 1, NULL, 10);
            break;
        }
    if (status)
        fclose (status);
    return (uint64_t) kib << 10;
}

//  A node faults its segments in after it starts (shm/segment.c); the figures are of a
//  settled node, as one is for all but its first seconds: waits while its mapped shared
//  memory still grows (SETTLE_MAX_MS at most).
static void
s_settle (pid_t pid)
{
    uint64_t last = bench_proc_status_bytes (pid, "RssShmem");
    for (int waited = 0; waited < SETTLE_MAX_MS; waited += SETTLE_STEP_MS) {
        usleep (SETTLE_STEP_MS * 1000);
        uint64_t now = bench_proc_status_bytes (pid, "RssShmem");
        if (now < last + (1 << 20))
            return;
        last = now;
    }
}

bool
bench_kvpoold_takes (const char *path, const char *option)
{
    char command[1200];
    snprintf (command, sizeof command, "'%s' --help 2>/dev/null", path);
    FILE *help = popen (command, "r");
    if (!help)
        return false;
    char line[4096];
    bool found = false;
    size_t len = strlen (option);
    while (fgets (line, sizeof line, help))
        for (const char *at = strstr (line, option); at && !found; at = strstr (at + 1, option))
            found = at[len] == ' ' || at[len] == '\n' || at[len] == '=';
    pclose (help);
    return found;
}

int
bench_kvpoold_start (bench_kvpoold_t *self, const char *path, const char *name,
                     const char *const *args)
{
    memset (self, 0, sizeof *self);
    snprintf (self->ready_file, sizeof self->ready_file, "/tmp/kvpool-bench-%d-%s.ready",
              (int) getpid (), name);
    snprintf (self->log, sizeof self->log, "/tmp/kvpool-bench-%d-%s.log", (int) getpid (), name);
    unlink (self->ready_file);
    if (access (path, X_OK) != 0) {
        fprintf (stderr, "kvpool-bench: cannot run %s: %s\n", path, strerror (errno));
        self->log[0] = 0;
        return -1;
    }
    //  No metrics over HTTP unless args ask (they come after): daemons of several benches
    //  run side by side, and a port in use fails a start.
    const char *argv[64] = {
        path,           "--endpoint",     "tcp://127.0.0.1:*", "--admin", "tcp://127.0.0.1:*",
        "--ready-file", self->ready_file, "--metrics-port",    "0"};
    size_t argc = 9;
    for (size_t i = 0; args && args[i]; i++) {
        if (argc + 1 >= sizeof argv / sizeof argv[0]) {
            fprintf (stderr, "kvpool-bench: too many kvpoold arguments\n");
            self->log[0] = 0;
            return -1;
        }
        argv[argc++] = args[i];
    }
    argv[argc] = NULL;
    self->pid = bench_spawn (argv, self->log);
    if (self->pid < 0) {
        fprintf (stderr, "kvpool-bench: fork: %s\n", strerror (errno));
        self->pid = 0;
        return -1;
    }
    ready_file_t ready;
    int rc = ready_file_wait (self->ready_file, self->pid, READY_TIMEOUT_MS, &ready);
    if (rc == 0) {
        snprintf (self->endpoint, sizeof self->endpoint, "%s", ready.endpoint);
        snprintf (self->admin, sizeof self->admin, "%s", ready.admin_endpoint);
        s_settle (self->pid);
        return 0;
    }
    if (rc == -2) {
        //  ready_file_wait reaped it.
        s_forget (self->pid);
        self->pid = 0;
        fprintf (stderr, "kvpool-bench: kvpoold (%s) exited before it was ready (log: %s)\n", name,
                 self->log);
    }
    else {
        fprintf (stderr, "kvpool-bench: kvpoold (%s) not ready within %d s (log: %s)\n", name,
                 READY_TIMEOUT_MS / 1000, self->log);
        bench_stop (self->pid);
        self->pid = 0;
    }
    unlink (self->ready_file);
    return -1;
}

int
bench_kvpoold_stop (bench_kvpoold_t *self, bool keep_log)
{
    if (self->pid <= 0)
        return 0;
    int status = bench_stop (self->pid);
    self->pid = 0;
    unlink (self->ready_file);
    if (status != 0)
        fprintf (stderr, "kvpool-bench: kvpoold exited with status %d on SIGTERM (log: %s)\n",
                 status, self->log);
    else if (!keep_log) {
        unlink (self->log);
        self->log[0] = 0;
    }
    return status;
}

//  ---- the scratch directory ---------------------------------------------------------------

int
bench_scratch_new (const char *name, char *path, size_t size)
{
    if (s_scratch_set) {
        fprintf (stderr, "kvpool-bench: a scratch directory exists already (%s)\n", s_scratch);
        return -1;
    }
    char template[sizeof s_scratch];
    snprintf (template, sizeof template, "/tmp/kvpool-bench-%s-XXXXXX", name);
    if (!mkdtemp (template)) {
        fprintf (stderr, "kvpool-bench: mkdtemp %s: %s\n", template, strerror (errno));
        return -1;
    }
    snprintf (s_scratch, sizeof s_scratch, "%s", template);
    s_scratch_set = 1;
    snprintf (path, size, "%s", template);
    return 0;
}

static int
s_remove_entry (const char *path, const struct stat *info, int type, struct FTW *ftw)
{
    (void) info;
    (void) ftw;
    if ((type == FTW_DP ? rmdir (path) : unlink (path)) != 0 && errno != ENOENT)
        fprintf (stderr, "kvpool-bench: cannot remove %s: %s\n", path, strerror (errno));
    return 0;
}

void
bench_scratch_remove (void)
{
    if (!s_scratch_set)
        return;
    nftw (s_scratch, s_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    s_scratch_set = 0;
    s_scratch[0] = 0;
}

//  ---- interruption ----------------------------------------------------------------------

void
bench_on_signal (int signum)
{
    bench_detail_abort ();
    for (int i = 0; i < MAX_CHILDREN; i++)
        if (s_children[i] > 0)
            kill (s_children[i], SIGTERM);
    //  The children must be gone before their files go: up to 5 s, then SIGKILL.
    struct timespec tick = {0, 20 * 1000000L};
    for (int round = 0; round < 250; round++) {
        bool running = false;
        for (int i = 0; i < MAX_CHILDREN; i++)
            if (s_children[i] > 0) {
                if (waitpid (s_children[i], NULL, WNOHANG) != 0)
                    s_children[i] = 0;
                else
                    running = true;
            }
        if (!running)
            break;
        nanosleep (&tick, NULL);
    }
    for (int i = 0; i < MAX_CHILDREN; i++)
        if (s_children[i] > 0) {
            kill (s_children[i], SIGKILL);
            waitpid (s_children[i], NULL, 0);
        }
    if (s_scratch_set) {
        pid_t rm = fork ();
        if (rm == 0) {
            char *const argv[] = {"/bin/rm", "-rf", s_scratch, NULL};
            execv (argv[0], argv);
            _exit (127);
        }
        if (rm > 0)
            waitpid (rm, NULL, 0);
    }
    _exit (128 + signum);
}

//  ---- iperf3 ----------------------------------------------------------------------------

#define IPERF3 "/usr/bin/iperf3"

//  The file at path, NUL-terminated, in a malloc'ed buffer (the caller frees it), or NULL.
static char *
s_slurp (const char *path)
{
    FILE *file = fopen (path, "r");
    if (!file)
        return NULL;
    size_t capacity = 1 << 16, length = 0;
    char *text = (char *) malloc (capacity);
    while (text) {
        length += fread (text + length, 1, capacity - 1 - length, file);
        if (length < capacity - 1)
            break;
        char *grown = (char *) realloc (text, capacity * 2);
        if (!grown) {
            free (text);
            text = NULL;
        }
        text = grown;
        capacity *= 2;
    }
    if (text)
        text[length] = 0;
    fclose (file);
    return text;
}

//  end.sum_received.bits_per_second of iperf3's -J output, or NAN. The streams list under
//  "end" names its members "sender" and "receiver", so the first "sum_received" after "end"
//  is the one.
static double
s_iperf3_bps (const char *json)
{
    const char *end = strstr (json, "\"end\":");
    const char *sum = end ? strstr (end, "\"sum_received\":") : NULL;
    const char *close = sum ? strchr (sum, '}') : NULL;
    const char *bps = sum ? strstr (sum, "\"bits_per_second\":") : NULL;
    if (!bps || bps > close)
        return NAN;
    char *after;
    double value = strtod (bps + strlen ("\"bits_per_second\":"), &after);
    return after > bps && value > 0 ? value : NAN;
}

double
bench_iperf3 (int seconds, char *note, size_t note_size, bool *failed)
{
    *failed = false;
    if (access (IPERF3, X_OK) != 0) {
        snprintf (note, note_size, "iperf3 not installed (%s: %s; apt-get install iperf3)", IPERF3,
                  strerror (errno));
        return NAN;
    }
    char server_log[128], client_log[128], port_text[16], time_text[16];
    snprintf (server_log, sizeof server_log, "/tmp/kvpool-bench-%d-iperf3-server.log",
              (int) getpid ());
    snprintf (client_log, sizeof client_log, "/tmp/kvpool-bench-%d-iperf3.json", (int) getpid ());
    snprintf (time_text, sizeof time_text, "%d", seconds);
    double bps = NAN;
    char *json = NULL;
    for (int attempt = 0; attempt < 3 && isnan (bps); attempt++) {
        int port = bench_free_port ();
        snprintf (port_text, sizeof port_text, "%d", port);
        const char *server_argv[] = {IPERF3, "-s", "-1", "-B", "127.0.0.1", "-p", port_text, NULL};
        pid_t server = bench_spawn (server_argv, server_log);
        if (server < 0) {
            snprintf (note, note_size, "fork: %s", strerror (errno));
            *failed = true;
            return NAN;
        }
        //  The server listens within milliseconds; a client that came too early is refused at
        //  once (without using up the server's one test), and tries again.
        double deadline = bench_now () + 5;
        while (isnan (bps) && !bench_exited (server) && bench_now () < deadline) {
            const char *client_argv[] = {IPERF3, "-c",      "127.0.0.1", "-p", port_text,
                                         "-t",   time_text, "-J",        NULL};
            pid_t client = bench_spawn (client_argv, client_log);
            int status = client > 0 ? bench_wait (client) : -1;
            free (json);
            json = s_slurp (client_log);
            if (status == 0 && json)
                bps = s_iperf3_bps (json);
            else
                bench_sleep_ms (50);
        }
        bench_stop (server);
    }
    if (isnan (bps)) {
        snprintf (note, note_size,
                  "iperf3 -c 127.0.0.1 -t %d -J gave no end.sum_received.bits_per_second: %.300s",
                  seconds, json ? json : "(no output)");
        *failed = true;
    }
    else {
        unlink (client_log);
        unlink (server_log);
    }
    free (json);
    return bps / 8;
}

//  The first line of a small file, without its newline, or "" when it cannot be read.
static void
s_read_line (const char *path, char *out, size_t size)
{
    out[0] = 0;
    FILE *file = fopen (path, "r");
    if (!file)
        return;
    if (fgets (out, (int) size, file))
        out[strcspn (out, "\n")] = 0;
    fclose (file);
}

void
bench_machine (char *out, size_t size)
{
    char driver[64], poll_ns[32];
    s_read_line ("/sys/devices/system/cpu/cpuidle/current_driver", driver, sizeof driver);
    s_read_line ("/sys/module/haltpoll/parameters/guest_halt_poll_ns", poll_ns, sizeof poll_ns);
    int at = snprintf (out, size, "%ld CPUs", sysconf (_SC_NPROCESSORS_ONLN));
    if (*driver && at >= 0 && (size_t) at < size)
        at += snprintf (out + at, size - (size_t) at, ", cpuidle %s", driver);
    if (*poll_ns && at >= 0 && (size_t) at < size)
        snprintf (out + at, size - (size_t) at, ", guest_halt_poll_ns %s%s", poll_ns,
                  strcmp (poll_ns, "0") == 0 ? " (idle CPUs halt at once: every wake-up is slow)"
                                             : "");
}

//  CPU seconds (user and system, all threads) process pid has used, or NAN.
double
bench_cpu_seconds (pid_t pid)
{
    char path[64];
    snprintf (path, sizeof path, "/proc/%d/stat", (int) pid);
    FILE *file = fopen (path, "r");
    if (!file)
        return NAN;
    char line[1024];
    double seconds = NAN;
    if (fgets (line, sizeof line, file)) {
        //  Fields 14 and 15 (utime, stime), counted after the ")" that ends the name.
        const char *at = strrchr (line, ')');
        unsigned long long utime, stime;
        if (at
            && sscanf (at + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
                       &stime)
                   == 2)
            seconds = (double) (utime + stime) / (double) sysconf (_SC_CLK_TCK);
    }
    fclose (file);
    return seconds;
}
