/*
 * log.c - see log.h.
 */
#include "log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int max_level = LOG_LEVEL_INFO;
static atomic_int journal;

static const char *const level_names[] = {
	[LOG_LEVEL_ERR] = "error",     [LOG_LEVEL_WARNING] = "warning",
	[LOG_LEVEL_NOTICE] = "notice", [LOG_LEVEL_INFO] = "info",
	[LOG_LEVEL_DEBUG] = "debug",
};

void log_set_level(enum log_level level)
{
	atomic_store(&max_level, (int)level);
}

void log_set_journal(int on)
{
	atomic_store(&journal, on);
}

int log_level_parse(const char *name)
{
	for (int i = LOG_LEVEL_ERR; i <= LOG_LEVEL_DEBUG; i++)
		if (strcmp(name, level_names[i]) == 0)
			return i;
	return -1;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
	char line[2048];
	int n;
	va_list ap;

	if ((int)level > atomic_load(&max_level))
		return;
	if (atomic_load(&journal))
		n = snprintf(line, sizeof(line), "<%d>", (int)level);
	else
		n = snprintf(line, sizeof(line),
			     "gpucmdd: %s: ", level_names[level]);
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	/* One write per line so threads never interleave within a line. */
	if (write(STDERR_FILENO, line, (size_t)n) < 0) {
		/* Nowhere left to report it. */
	}
}

static unsigned long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (unsigned long long)ts.tv_sec * 1000000000ull +
	       (unsigned long long)ts.tv_nsec;
}

/* A new window when the last is over, saying what it left out. */
static void limit_roll(struct log_limit *l, unsigned long long now)
{
	if (now - l->start_ns < (unsigned long long)l->window_s * 1000000000ull)
		return;
	if (l->dropped > 0)
		log_notice("%llu %s left out of the log in the last %u s "
			   "(at most %u pass in %u s)",
			   l->dropped, l->what, l->window_s, l->burst,
			   l->window_s);
	l->start_ns = now;
	l->taken = 0;
	l->dropped = 0;
}

int log_limit_take(struct log_limit *l)
{
	limit_roll(l, now_ns());
	if (l->taken < l->burst) {
		l->taken++;
		return 1;
	}
	l->dropped++;
	return 0;
}

void log_limit_flush(struct log_limit *l)
{
	limit_roll(l, now_ns());
}

void log_require_failed(const char *what, const char *file, int line)
{
	log_err("internal invariant failed: %s at %s:%d; aborting", what, file,
		line);
	abort();
}
