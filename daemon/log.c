/*
 * log.c - see log.h.
 */
#include "log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
		n = snprintf(line, sizeof(line), "gpucmdd: %s: ",
			     level_names[level]);
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

void log_require_failed(const char *what, const char *file, int line)
{
	log_err("internal invariant failed: %s at %s:%d; aborting", what,
		file, line);
	abort();
}
