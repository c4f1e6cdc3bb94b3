/*  racy.h - marks reads that race with another thread on purpose.

    A reader of the read index (a seqlock) looks at a slot, or copies a value, that the
    writer may be changing at that very moment, and throws the result away when the slot's
    sequence number says it lost the race. ThreadSanitizer can't know that and would report
    every such read, so they run with its checks off for the reading thread. Elsewhere the
    macros are nothing.
*/
#ifndef RACY_H_INCLUDED
#define RACY_H_INCLUDED

//  RACY_READ_FENCE() orders a reader's plain reads before its second look at the sequence
//  number: an acquire fence. ThreadSanitizer does not model fences (GCC warns about them), and
//  its builds run these reads unchecked anyway, so there it is a compiler barrier, which is
//  enough on x86, where loads are not reordered with loads (sanitizer builds are for tests).
#if defined(__SANITIZE_THREAD__)
void __tsan_ignore_thread_begin (void);
void __tsan_ignore_thread_end (void);
#define RACY_BEGIN() __tsan_ignore_thread_begin ()
#define RACY_END() __tsan_ignore_thread_end ()
#define RACY_READ_FENCE() __atomic_signal_fence (__ATOMIC_SEQ_CST)
#else
#define RACY_BEGIN() ((void) 0)
#define RACY_END() ((void) 0)
#define RACY_READ_FENCE() atomic_thread_fence (memory_order_acquire)
#endif

#endif
