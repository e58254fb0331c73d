/* inotify(7) for the agent's cgroup watches: thin wrappers returning errno values, and one
 * non-blocking read flattened into records and a names buffer (no pointers for Python to follow). */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "topolet.h"

_Static_assert(TOPO_IN_MODIFY == IN_MODIFY, "IN_MODIFY");
_Static_assert(TOPO_IN_CREATE == IN_CREATE, "IN_CREATE");
_Static_assert(TOPO_IN_DELETE == IN_DELETE, "IN_DELETE");
_Static_assert(TOPO_IN_DELETE_SELF == IN_DELETE_SELF, "IN_DELETE_SELF");
_Static_assert(TOPO_IN_MOVE_SELF == IN_MOVE_SELF, "IN_MOVE_SELF");
_Static_assert(TOPO_IN_Q_OVERFLOW == IN_Q_OVERFLOW, "IN_Q_OVERFLOW");
_Static_assert(TOPO_IN_IGNORED == IN_IGNORED, "IN_IGNORED");
_Static_assert(TOPO_IN_ONLYDIR == IN_ONLYDIR, "IN_ONLYDIR");
_Static_assert(TOPO_IN_ISDIR == IN_ISDIR, "IN_ISDIR");
_Static_assert(TOPO_INOTIFY_MIN_READ == sizeof(struct inotify_event) + NAME_MAX + 1, "MIN_READ");

/* The largest read made at once. */
#define READ_MAX 65536

int topo_inotify_init(int32_t *fd)
{
    int got = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);

    *fd = -1;
    if (got < 0)
        return errno;
    *fd = got;
    return 0;
}

int topo_inotify_add_watch(int32_t fd, const char *path, uint32_t mask, int32_t *wd)
{
    int got = inotify_add_watch(fd, path, mask);

    *wd = -1;
    if (got < 0)
        return errno;
    *wd = got;
    return 0;
}

int topo_inotify_rm_watch(int32_t fd, int32_t wd)
{
    return inotify_rm_watch(fd, wd) == 0 ? 0 : errno;
}

int topo_inotify_read(int32_t fd, topo_inotify_event_t *events, size_t cap, char *names,
                      size_t names_cap, size_t *nevents)
{
    char *buf;
    size_t want = cap * sizeof(struct inotify_event);
    size_t used = 0, n = 0;
    ssize_t got;

    *nevents = 0;
    if (want > names_cap)
        want = names_cap;
    if (want > READ_MAX)
        want = READ_MAX;
    if (want < TOPO_INOTIFY_MIN_READ)
        return EINVAL;
    buf = malloc(want); /* malloc's alignment suits struct inotify_event */
    if (buf == NULL)
        return ENOMEM;
    do
        got = read(fd, buf, want);
    while (got < 0 && errno == EINTR);
    if (got < 0) {
        int rc = errno == EAGAIN ? 0 : errno;
        free(buf);
        return rc;
    }
    /* Every record is at least 16 bytes and its name at most its own len bytes, so n <= cap and
     * used <= names_cap follow from got <= want. */
    for (size_t off = 0; off + sizeof(struct inotify_event) <= (size_t)got;) {
        const struct inotify_event *ev = (const struct inotify_event *)(const void *)(buf + off);
        size_t next = off + sizeof *ev + ev->len;

        if (next > (size_t)got) {
            free(buf);
            return EIO; /* a record cut short: never from the kernel */
        }
        events[n].wd = ev->wd;
        events[n].mask = ev->mask;
        events[n].name = -1;
        if (ev->len > 0) {
            size_t len = strnlen(ev->name, ev->len);
            if (len == ev->len) {
                free(buf);
                return EIO; /* no terminating NUL: never from the kernel */
            }
            if (len > 0) {
                memcpy(names + used, ev->name, len);
                names[used + len] = '\0';
                events[n].name = (int32_t)used;
                used += len + 1;
            }
        }
        n++;
        off = next;
    }
    free(buf);
    *nevents = n;
    return 0;
}
