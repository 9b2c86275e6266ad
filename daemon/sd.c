/*
 * sd.c - the daemon's only contact with libsystemd.  See sd.h.
 */
#include "sd.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "gpucmd.h"

int sd_listen_fd(int *fd, char *why, size_t why_len)
{
	int n = sd_listen_fds(1);

	*fd = -1;
	if (n < 0) {
		snprintf(why, why_len,
			 "cannot read the sockets systemd "
			 "passed: %s",
			 strerror(-n));
		return GPUCMD_EINVAL;
	}
	if (n == 0)
		return 0;
	if (n > 1) {
		snprintf(why, why_len,
			 "systemd passed %d sockets; gpucmdd takes exactly one "
			 "Unix stream socket (check ListenStream= in the "
			 ".socket unit)",
			 n);
		return GPUCMD_EINVAL;
	}
	if (sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_STREAM, 1, NULL, 0) <=
	    0) {
		snprintf(why, why_len,
			 "the socket systemd passed is not a listening Unix "
			 "stream socket (check ListenStream= in the .socket "
			 "unit)");
		return GPUCMD_EINVAL;
	}
	*fd = SD_LISTEN_FDS_START;
	return 0;
}

bool sd_stderr_is_journal(void)
{
	const char *env = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (env == NULL || sscanf(env, "%llu:%llu", &dev, &ino) != 2)
		return false;
	if (fstat(STDERR_FILENO, &st) != 0)
		return false;
	return (unsigned long long)st.st_dev == dev &&
	       (unsigned long long)st.st_ino == ino;
}

void sd_ready(const char *status)
{
	sd_notifyf(0, "READY=1\nSTATUS=%s", status);
}

void sd_status(const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	sd_notifyf(0, "STATUS=%s", buf);
}

/*
 * systemd 253 and later want MONOTONIC_USEC= beside RELOADING=1, to tell
 * this reload from an older one; earlier versions ignore it.
 */
void sd_reloading(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	sd_notifyf(0,
		   "RELOADING=1\nMONOTONIC_USEC=%llu\n"
		   "STATUS=reloading the configuration",
		   (unsigned long long)ts.tv_sec * 1000000ull +
			   (unsigned long long)ts.tv_nsec / 1000ull);
}

void sd_stopping(void)
{
	sd_notify(0, "STOPPING=1\nSTATUS=stopping");
}

uint64_t sd_watchdog_usec(void)
{
	uint64_t usec = 0;

	if (sd_watchdog_enabled(0, &usec) <= 0)
		return 0;
	return usec;
}

void sd_watchdog_ping(void)
{
	sd_notify(0, "WATCHDOG=1");
}
