/*
 * listen_fail.so - an LD_PRELOAD shim for socket_path.sh: the
 * $LISTEN_FAIL_AT-th call of listen(2) in the process fails with
 * EADDRINUSE, and every other one is the real call.  It reaches the
 * daemon's paths for a listen that fails after the socket was bound (the
 * accept pause's resume, the socket bound again), which no real setup
 * makes happen on demand.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>

/* Exported: the build hides symbols by default. */
__attribute__((visibility("default"))) int listen(int fd, int backlog)
{
	static atomic_int calls;
	static int (*real)(int, int);
	const char *at = getenv("LISTEN_FAIL_AT");

	if (real == NULL)
		*(void **)&real = dlsym(RTLD_NEXT, "listen");
	if (at != NULL && atomic_fetch_add(&calls, 1) + 1 == atoi(at)) {
		errno = EADDRINUSE;
		return -1;
	}
	return real(fd, backlog);
}
