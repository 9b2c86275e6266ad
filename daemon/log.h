/*
 * log.h - the daemon's one logging family.
 *
 * Lines go to stderr as "gpucmdd: LEVEL: text", or, under systemd (sd.c
 * decides), with an "<N>" priority prefix the journal understands.  Any
 * thread may log; each line is written with one write(2) so lines from the
 * loop and device threads never interleave.  Library code (client/, proto/,
 * memory/, driver/) does not log: the daemon logs once, where it knows the
 * service, the connection and the op.
 */
#pragma once

#include <stdarg.h>

enum log_level {
	LOG_LEVEL_ERR = 3,
	LOG_LEVEL_WARNING = 4,
	LOG_LEVEL_NOTICE = 5,
	LOG_LEVEL_INFO = 6,
	LOG_LEVEL_DEBUG = 7,
};

/** Set the most verbose level printed (default info). */
void log_set_level(enum log_level level);
/** Prefix lines with "<N>" syslog priorities (for the journal). */
void log_set_journal(int on);
/** Parse "debug", "info", ...; -1 when unknown. */
int log_level_parse(const char *name);

/** Log one line at level. */
void log_msg(enum log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define log_err(...) log_msg(LOG_LEVEL_ERR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LEVEL_WARNING, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_LEVEL_NOTICE, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__)

/*
 * A rate limit for lines that a client can cause at will (a connection
 * opened and closed in a loop logs two).  Unbounded, they would fill the
 * disk or, under systemd, run journald into its own rate limit, which then
 * drops every line of the unit, other tenants' faults and refusals too.
 * At most burst lines pass per window of window_s seconds; the rest are
 * counted, and the first line of a later window (or log_limit_flush, from
 * a timer) first says how many were left out.  One thread per limit.
 */
struct log_limit {
	const char *what; /* "connection lines": named in the summary */
	unsigned window_s;
	unsigned burst;
	unsigned long long start_ns; /* the window's start */
	unsigned taken;		     /* lines passed in this window */
	unsigned long long dropped;  /* lines left out in it */
};

#define LOG_LIMIT_INIT(what_, window_s_, burst_) \
	{ .what = (what_), .window_s = (window_s_), .burst = (burst_) }

/** Whether the next line may pass l (counted either way). */
int log_limit_take(struct log_limit *l);
/** Log the count of lines left out once l's window is over, and reset it. */
void log_limit_flush(struct log_limit *l);

/*
 * require(cond): an always-on check of a true invariant of the daemon's own
 * code (never of client input).  When it fails the daemon logs where and
 * aborts, so systemd restarts it with a core to look at.
 */
#define require(cond)                                                  \
	do {                                                           \
		if (!(cond))                                           \
			log_require_failed(#cond, __FILE__, __LINE__); \
	} while (0)

/** Report a failed require() and abort. */
void log_require_failed(const char *what, const char *file, int line)
	__attribute__((noreturn));
