/*  lru_list.h - an intrusive, circular, doubly linked list with a count: objects that embed a
    lru_link_t are kept in the order they were appended (oldest first) and moved or taken out
    in O(1), with no allocation. The replica-manager keeps its eviction orders in these.

    A link that is in no list has next == NULL. Threads: none of its own; a list belongs to
    the one thread that uses it.
*/
#ifndef LRU_LIST_H_INCLUDED
#define LRU_LIST_H_INCLUDED

#include <stdbool.h>
#include <stddef.h>

typedef struct _lru_link_t {
    struct _lru_link_t *prev, *next;
} lru_link_t;

typedef struct {
    lru_link_t head; //  head.next is the oldest, head.prev the newest
    size_t count;
} lru_list_t;

//  The struct that embeds link as its member `member`.
#define lru_entry(link, type, member) ((type *) ((char *) (link) -offsetof (type, member)))

static inline void
lru_list_init (lru_list_t *list)
{
    list->head.prev = list->head.next = &list->head;
    list->count = 0;
}

static inline bool
lru_linked (const lru_link_t *link)
{
    return link->next != NULL;
}

static inline void
lru_remove (lru_list_t *list, lru_link_t *link)
{
    if (!link->next)
        return;
    link->prev->next = link->next;
    link->next->prev = link->prev;
    link->prev = link->next = NULL;
    list->count--;
}

//  Appends link as the newest (taking it out of this list first if it is in it).
static inline void
lru_append (lru_list_t *list, lru_link_t *link)
{
    lru_remove (list, link);
    link->prev = list->head.prev;
    link->next = &list->head;
    list->head.prev->next = link;
    list->head.prev = link;
    list->count++;
}

//  The oldest link, or NULL when the list is empty.
static inline lru_link_t *
lru_first (lru_list_t *list)
{
    return list->head.next == &list->head ? NULL : list->head.next;
}

//  The link after link, or NULL at the end.
static inline lru_link_t *
lru_next (lru_list_t *list, lru_link_t *link)
{
    return link->next == &list->head ? NULL : link->next;
}

#endif
