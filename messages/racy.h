/*  racy.h - marks reads that race with another thread on purpose.

    A reader of the read index (a seqlock) looks at a slot, or copies a value, that the
    writer may be changing at that very moment, and throws the result away when the slot's
    sequence number says it lost the race. ThreadSanitizer can't know that and would report
    every such read, so they run with its checks off for the reading thread. Elsewhere the
    macros are nothing.
*/
#ifndef RACY_H_INCLUDED
#define RACY_H_INCLUDED

#if defined(__SANITIZE_THREAD__)
void __tsan_ignore_thread_begin (void);
void __tsan_ignore_thread_end (void);
#define RACY_BEGIN() __tsan_ignore_thread_begin ()
#define RACY_END() __tsan_ignore_thread_end ()
#else
#define RACY_BEGIN() ((void) 0)
#define RACY_END() ((void) 0)
#endif

#endif
