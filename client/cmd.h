/*
 * cmd.h - what the files of the gpucmd tool share: the global options, the
 * exit statuses, one entry point per subcommand, and the helpers in
 * gpucmd.c that every subcommand prints and connects with.
 *
 * The tool is a plain client of the public library (gpucmd.h); nothing here
 * reaches into the library's internals.  Subcommands run on the main
 * thread, print results on stdout and diagnostics on stderr, and return an
 * exit status instead of calling exit(), so main stays the one place that
 * ends the process.
 */
#pragma once

#include <stdint.h>
#include <stdio.h>

#include "gpucmd.h"

/* Exit statuses (gpucmd(1) EXIT STATUS). */
#define TOOL_EXIT_OK 0
#define TOOL_EXIT_FAIL 1  /* the daemon answered with an error */
#define TOOL_EXIT_USAGE 2 /* bad command line or script */
/* the daemon cannot be reached (EX_UNAVAILABLE) */
#define TOOL_EXIT_UNAVAILABLE 69

/* Room for a size printed by tool_size. */
#define TOOL_SIZE_LEN 24

/* Options given before the subcommand. */
struct tool_opts {
	const char *socket;  /* --socket, NULL: $GPUCMD_SOCKET or default */
	const char *service; /* --service */
	int timeout_ms; /* --timeout: of connecting and each wait, -1 none */
	/*
	 * Of connecting alone, when it differs: exec without --timeout waits
	 * for ever for the user's work, but not for a daemon that never says
	 * Welcome.
	 */
	int connect_timeout_ms;
};

/** gpucmd ping [-c COUNT]: round trips with a ping op. */
int cmd_ping(const struct tool_opts *o, int argc, char **argv);
/** gpucmd status [--json]: the daemon's status and this connection's limits. */
int cmd_status(const struct tool_opts *o, int argc, char **argv);
/** gpucmd memory-report [--json|--prometheus] [...]: memory per service. */
int cmd_memory_report(const struct tool_opts *o, int argc, char **argv);
/** gpucmd exec [--service NAME] [--json] [SCRIPT|-]: run a script. */
int cmd_exec(const struct tool_opts *o, int argc, char **argv);
/** gpucmd services [--json]: one line per service. */
int cmd_services(const struct tool_opts *o, int argc, char **argv);
/** gpucmd evict SERVICE | --connection ID: end connections. */
int cmd_evict(const struct tool_opts *o, int argc, char **argv);
/** gpucmd cleanup [SERVICE]: return a service's free memory to the device. */
int cmd_cleanup(const struct tool_opts *o, int argc, char **argv);

/** The socket the tool connects to: --socket, $GPUCMD_SOCKET or the default. */
const char *tool_socket_path(const struct tool_opts *o);
/**
 * Connect as service (NULL: the global --service).  On failure the reason
 * is printed and the exit status to return is the result; 0 on success.
 */
int tool_connect(const struct tool_opts *o, const char *service,
		 struct gpucmd_conn **out);
/**
 * Connect to read reports and run admin commands: an admin joins no
 * service (GPUCMD_CONNECT_OBSERVE), so the report it reads does not show
 * the tool; anyone else joins the global --service as tool_connect does.
 */
int tool_observe(const struct tool_opts *o, struct gpucmd_conn **out);
/**
 * Report a failed library call ("gpucmd: what: reason") and return the exit
 * status it deserves: TOOL_EXIT_UNAVAILABLE when the daemon went away,
 * TOOL_EXIT_FAIL when it answered with an error.
 */
int tool_fail(const char *what, int code);
/** tool_fail with the daemon's sentence (gpucmd_last_message) when there is one. */
int tool_fail_why(const char *what, int code, const char *why);
/**
 * tool_fail_why for a call on conn: the daemon's reason for closing the
 * connection when it did (an eviction names who evicted), else its
 * sentence for the failed request (gpucmd_last_message).
 */
int tool_fail_conn(const char *what, int code, const struct gpucmd_conn *conn);
/** The exit status for a library error code, as tool_fail decides it. */
int tool_exit_status(int code);
/**
 * Print usage text to stdout (status 0, --help) or to stderr after
 * "prog: complaint" when complaint is not NULL; returns status.
 */
int tool_usage(const char *prog, const char *usage, int status,
	       const char *complaint, ...)
	__attribute__((format(printf, 4, 5)));
/**
 * Parse the flags shared by the report commands (--json, --bytes where
 * bytes is not NULL, --help).  -1 when the command should go on, else the
 * exit status to return.
 */
int tool_flags(int argc, char **argv, const char *usage, int *json, int *bytes);

/** Print s as a JSON string literal, quotes included, escaped and valid UTF-8. */
void tool_json_string(FILE *f, const char *s);
/** Write a byte count as "1.5 MiB" (exact when exact is set) into buf. */
const char *tool_size(uint64_t bytes, int exact, char *buf, size_t len);
/**
 * Fragmentation of memory with usage u whose largest free block is
 * largest_free: 1 - largest_free / free, where free = reserved - in use -
 * padding; 0 when nothing is free.  Defined here once for every output.
 */
double tool_fragmentation(const struct gpucmd_memory_usage *u,
			  uint64_t largest_free);
/** Largest free block over a stream's pools. */
uint64_t tool_stream_largest_free(const struct gpucmd_stream_report *sr);
/** Print a stream's pools as a table, indented by indent blanks. */
int tool_pool_table(const struct gpucmd_stream_report *sr, int exact,
		    int indent);
/**
 * Print a stream's report as JSON members (no braces): connection_id,
 * stream, usage, largest_free, fragmentation and pools[].
 */
void tool_json_stream(const struct gpucmd_stream_report *sr);
/** Print usage as the JSON members allocations, bytes_in_use, bytes_padding, bytes_reserved. */
void tool_json_usage(const struct gpucmd_memory_usage *u);

/**
 * Parse an unsigned number in decimal or 0x hex, with an optional K, M or G
 * (KiB, MiB, GiB) suffix when suffix is set: 0, or -1 when s is not one.
 */
int tool_parse_u64(const char *s, int suffix, uint64_t *out);
