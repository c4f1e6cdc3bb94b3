/*  spin_poll.h - a short busy wait on sockets before an actor goes to sleep in poll.

    A hop between actors costs a thread wake-up when the receiving thread sleeps in poll; on
    a virtual machine that is tens of microseconds, more than the work of a whole request.
    An actor that expects a message soon (a reply to a job it sent, or the next request of a
    burst) checks its sockets for a few microseconds first. The wait is bounded and short so
    an idle daemon costs nothing.

    Threads: called by the actor that owns the sockets.
*/
#ifndef SPIN_POLL_H_INCLUDED
#define SPIN_POLL_H_INCLUDED

#include <czmq.h>

#include "actors/wait_set.h"

//  Returns a socket of the set with a message waiting, checking for up to spin_us
//  microseconds, or NULL if none became readable in that time.
zsock_t *spin_poll (wait_set_t *set, int spin_us);

#endif
