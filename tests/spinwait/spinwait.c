/* A test-cluster aid (tests/spinwait/README.md): a socket call that would block waits up to a millisecond for its
 * socket to be ready before it says so.
 *
 * MLX's ring backend waits for a peer by calling recv()/send() on non-blocking sockets in a loop. On a real cluster
 * each rank has a machine of its own and the loop costs nothing anyone else wanted; on the test cluster three or
 * four ranks share two cores, so a rank that waits takes the cores from the rank it waits for. Preloaded into the
 * simulated hosts' sessions, this makes a call that found nothing to do (EAGAIN) sleep in poll() until the socket
 * is ready or 1 ms has passed, then return exactly what it returned: no byte, order or error changes. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

static ssize_t (*real_recv)(int, void *, size_t, int);
static ssize_t (*real_send)(int, const void *, size_t, int);

__attribute__((constructor)) static void find_real(void) {
    real_recv = (ssize_t (*)(int, void *, size_t, int))dlsym(RTLD_NEXT, "recv");
    real_send = (ssize_t (*)(int, const void *, size_t, int))dlsym(RTLD_NEXT, "send");
}

static void wait_ready(int fd, short events, int flags) {
    if (flags & MSG_DONTWAIT)            /* the caller asked for an answer now: leave it alone */
        return;
    int saved = errno;
    struct pollfd p = {fd, events, 0};
    poll(&p, 1, 1);
    errno = saved;
}

ssize_t recv(int fd, void *buf, size_t n, int flags) {
    if (!real_recv) find_real();
    ssize_t r = real_recv(fd, buf, n, flags);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) wait_ready(fd, POLLIN, flags);
    return r;
}

ssize_t send(int fd, const void *buf, size_t n, int flags) {
    if (!real_send) find_real();
    ssize_t r = real_send(fd, buf, n, flags);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) wait_ready(fd, POLLOUT, flags);
    return r;
}
