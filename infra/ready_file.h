/*  ready_file.h - the one reader of kvpoold's ready file, for the C tests and kvpool-bench.

    kvpoold --ready-file PATH writes, once it serves, a line per bound endpoint and its pid
    (tools/kvpoold.c, s_write_ready_file):
        endpoint=tcp://127.0.0.1:41234
        endpoint=ipc://@kvpool-41234
        admin=tcp://127.0.0.1:41235
        pid=12345
    It writes the file under another name and renames it, so a reader sees all of it or none.
    Programs that start kvpoold on ephemeral ports (tcp://127.0.0.1:*) learn from it which
    ports it got. The other readers: tests/python/kvpool_daemon.py for Python (the tests and the
    Python bench), tests/extra/ready_file.bash for the shell tests.
*/
#ifndef READY_FILE_H_INCLUDED
#define READY_FILE_H_INCLUDED

#include <sys/types.h>

typedef struct {
    char endpoint[256];       //  the first tcp:// client endpoint
    char ipc_endpoint[256];   //  the first ipc:// client endpoint ("" if none)
    char admin_endpoint[256]; //  the first admin endpoint ("" if none)
    pid_t pid;                //  0 if the file does not say
} ready_file_t;

//  Reads the ready file at path into ready. Returns 0, or -1 when there is no such file (yet)
//  or it names no tcp client endpoint.
int ready_file_read (const char *path, ready_file_t *ready);

//  Waits up to timeout_ms for the ready file of kvpoold, a child of this process, and reads it
//  as ready_file_read does. Returns 0 once read, -1 when the time ran out, or -2 when the child
//  exited first (it is reaped).
int ready_file_wait (const char *path, pid_t child, int timeout_ms, ready_file_t *ready);

#endif
