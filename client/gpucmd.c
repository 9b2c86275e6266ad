/*
 * gpucmd.c - the gpucmd command-line tool: global options, the subcommand
 * table, and the helpers its subcommands share (connecting with a useful
 * message, exit statuses, JSON strings, sizes, numbers).
 *
 * Global options come before the subcommand and stop at its name
 * ("+" in getopt), so a subcommand's own flags never clash with them.  Each
 * subcommand gets argv starting at its name, rewritten to "gpucmd NAME" so
 * getopt's complaints say which command they are about.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <math.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "cmd.h"

struct tool_command {
	const char *name;
	int (*run)(const struct tool_opts *o, int argc, char **argv);
	const char *summary;
	bool waits_for_work; /* runs the user's work: no default timeout */
};

static const struct tool_command commands[] = {
	{ "ping", cmd_ping, "measure round trips to the daemon", false },
	{ "status", cmd_status,
	  "show the daemon's status and this client's limits", false },
	{ "memory-report", cmd_memory_report,
	  "show device memory per service, stream and pool", false },
	{ "services", cmd_services, "list the services and what they hold",
	  false },
	{ "evict", cmd_evict, "end a service's connections (or one connection)",
	  false },
	{ "cleanup", cmd_cleanup,
	  "return a service's free memory to the device", false },
	{ "exec", cmd_exec, "run a script of operations (see gpucmd(1))",
	  true },
};

/* The timeout of the commands that only ask the daemon (--timeout). */
#define TOOL_DEFAULT_TIMEOUT_MS 30000

/* The timeout in force, for tool_fail's sentence. */
static int tool_timeout_ms = -1;

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

/*
 * Whatever the command printed must have reached stdout: a full disk or a
 * closed stdout is a failure (1), or the metrics file renamed into place
 * after `> tmp && mv` would be cut short with nobody told.
 */
static int finish_output(int status)
{
	errno = 0;
	if (fflush(stdout) == 0 && !ferror(stdout) && fclose(stdout) == 0)
		return status;
	fprintf(stderr, "gpucmd: cannot write the output: %s\n",
		errno != 0 ? strerror(errno) :
			     "a write failed (standard output closed, or its "
			     "disk full)");
	return status == TOOL_EXIT_OK ? TOOL_EXIT_FAIL : status;
}

/*
 * A descriptor 0 to 2 the tool was started without would be taken by the
 * daemon's socket, and the report printed into the protocol: /dev/null,
 * read-only, takes its place, so that writes to it fail (exit 1).
 */
static void keep_std_fds(void)
{
	for (int fd = 0; fd <= 2; fd++) {
		int n;

		if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
			continue;
		n = open("/dev/null", O_RDONLY);
		if (n >= 0 && n != fd) {
			dup2(n, fd);
			close(n);
		}
	}
}

static const struct tool_command *find_command(const char *name)
{
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (strcmp(name, commands[i].name) == 0)
			return &commands[i];
	return NULL;
}

static void main_usage(FILE *f)
{
	fprintf(f,
		"usage: gpucmd [--socket PATH] [--service NAME] [--timeout SECONDS]\n"
		"              COMMAND [ARGS]\n"
		"       gpucmd --help | --version\n"
		"\n"
		"options:\n"
		"  --socket PATH   daemon socket (default: $GPUCMD_SOCKET, else %s)\n"
		"  --service NAME  service to speak for (default: default)\n"
		"  --timeout SECONDS\n"
		"                  give up when the daemon does not answer in time\n"
		"                  (exit 69); 0 waits for ever (default: %d for\n"
		"                  every command but exec, which waits for ever)\n"
		"  --help          show this help\n"
		"  --version       show the version\n"
		"\n"
		"commands:\n",
		GPUCMD_DEFAULT_SOCKET, TOOL_DEFAULT_TIMEOUT_MS / 1000);
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(f, "  %-14s  %s\n", commands[i].name,
			commands[i].summary);
	fprintf(f, "\n'gpucmd COMMAND --help' (or 'gpucmd help COMMAND') "
		   "describes a command;\nman gpucmd has the details.\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "service", required_argument, NULL, 'S' },
		{ "timeout", required_argument, NULL, 'T' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct tool_opts o = { .socket = NULL,
			       .service = "default",
			       .timeout_ms = -2 };
	const struct tool_command *cmd;
	char *help_argv[3];
	char prog[64];
	const char *name;
	double sec;
	char *end;
	int c;

	keep_std_fds();
	/* getopt's own complaints start with it, as every other message. */
	argv[0] = (char *)"gpucmd";
	while ((c = getopt_long(argc, argv, "+hV", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			/* Most often "$SOCK" unset: the command line's fault,
			 * not an unreachable daemon (69). */
			if (optarg[0] == '\0') {
				fprintf(stderr, "gpucmd: --socket needs a path "
						"(an empty one was given)\n");
				return TOOL_EXIT_USAGE;
			}
			o.socket = optarg;
			break;
		case 'S':
			o.service = optarg;
			break;
		case 'T':
			errno = 0;
			sec = strtod(optarg, &end);
			if (errno != 0 || end == optarg || *end != '\0' ||
			    !(sec >= 0 && sec <= 86400)) {
				fprintf(stderr,
					"gpucmd: --timeout '%s' is not "
					"a number of seconds from 0 to 86400\n",
					optarg);
				return TOOL_EXIT_USAGE;
			}
			/* 0 waits for ever; anything else at least 1 ms. */
			o.timeout_ms = sec == 0 ? -1 : (int)ceil(sec * 1000);
			if (o.timeout_ms == 0)
				o.timeout_ms = 1;
			break;
		case 'h':
			main_usage(stdout);
			return finish_output(TOOL_EXIT_OK);
		case 'V':
			printf("gpucmd %s\n", GPUCMD_VERSION_STRING);
			return finish_output(TOOL_EXIT_OK);
		default:
			main_usage(stderr);
			return TOOL_EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		fprintf(stderr, "gpucmd: no command given\n\n");
		main_usage(stderr);
		return TOOL_EXIT_USAGE;
	}
	name = argv[optind];
	if (strcmp(name, "help") == 0) {
		if (optind + 1 >= argc) {
			main_usage(stdout);
			return finish_output(TOOL_EXIT_OK);
		}
		/* gpucmd help COMMAND: that command's --help. */
		name = argv[optind + 1];
		if (strcmp(name, "help") == 0) {
			main_usage(stdout);
			return finish_output(TOOL_EXIT_OK);
		}
		if (find_command(name) == NULL) {
			fprintf(stderr,
				"gpucmd: no command '%s' to describe\n\n",
				name);
			main_usage(stderr);
			return TOOL_EXIT_USAGE;
		}
		help_argv[0] = argv[optind + 1];
		help_argv[1] = "--help";
		help_argv[2] = NULL;
		argv = help_argv;
		argc = 2;
		optind = 0;
	}
	cmd = find_command(name);
	if (cmd == NULL) {
		fprintf(stderr, "gpucmd: unknown command '%s'\n\n", name);
		main_usage(stderr);
		return TOOL_EXIT_USAGE;
	}
	snprintf(prog, sizeof(prog), "gpucmd %s", name);
	o.connect_timeout_ms = o.timeout_ms;
	if (o.timeout_ms == -2) {
		o.timeout_ms =
			cmd->waits_for_work ? -1 : TOOL_DEFAULT_TIMEOUT_MS;
		/* Saying Hello is not the user's work: it may not hang. */
		o.connect_timeout_ms = TOOL_DEFAULT_TIMEOUT_MS;
	}
	tool_timeout_ms = o.timeout_ms;
	argv[optind] = prog;
	argc -= optind;
	argv += optind;
	optind = 0; /* GNU getopt: start over for the subcommand */
	return finish_output(cmd->run(&o, argc, argv));
}

const char *tool_socket_path(const struct tool_opts *o)
{
	const char *env = getenv("GPUCMD_SOCKET");

	if (o->socket != NULL)
		return o->socket;
	if (env != NULL && env[0] != '\0')
		return env;
	return GPUCMD_DEFAULT_SOCKET;
}

/*
 * A socket error or a lost connection means no daemon is there to answer
 * (69); a GPUCMD_E* code (other than a peer that does not speak the
 * protocol) is the daemon's own answer, and any other system error (no
 * memory for a region here, too many open files) a failure of this
 * process: 1.
 */
int tool_exit_status(int code)
{
	switch (code) {
	case GPUCMD_EDISCONNECTED:
	case GPUCMD_EPROTO:
	case GPUCMD_EVERSION:
	case -ENOENT:
	case -ENOTDIR:
	case -ENAMETOOLONG:
	case -EACCES:
	case -EPERM:
	case -ECONNREFUSED:
	case -ECONNRESET:
	case -ECONNABORTED:
	case -ENOTCONN:
	case -ENOTSOCK:
	case -EPIPE:
	case -ETIMEDOUT:
	case -EAGAIN:
		return TOOL_EXIT_UNAVAILABLE;
	default:
		return TOOL_EXIT_FAIL;
	}
}

/*
 * Why a socket at path is not open to this user, from what stat says: the
 * socket's mode, owner and group, and who may connect; or the directory in
 * the way.  Where the package set it up, group gpucmd.
 */
static void say_no_access(const char *path)
{
	struct stat st;
	const struct group *gr;
	const struct passwd *pw;
	char gname[64], uname[64];

	if (stat(path, &st) != 0) {
		if (errno == EACCES)
			fprintf(stderr,
				"gpucmd: a directory on the way to %s "
				"is not open to this user\n",
				path);
		else
			fprintf(stderr,
				"gpucmd: the socket is not open to this "
				"user\n");
		return;
	}
	gr = getgrgid(st.st_gid);
	pw = getpwuid(st.st_uid);
	if (gr != NULL)
		snprintf(gname, sizeof(gname), "%s", gr->gr_name);
	else
		snprintf(gname, sizeof(gname), "%u", (unsigned)st.st_gid);
	if (pw != NULL)
		snprintf(uname, sizeof(uname), "%s", pw->pw_name);
	else
		snprintf(uname, sizeof(uname), "%u", (unsigned)st.st_uid);
	fprintf(stderr,
		"gpucmd: the socket (mode %04o, owner %s, group %s) is "
		"not open to this user; ",
		(unsigned)(st.st_mode & 07777), uname, gname);
	if (st.st_mode & S_IWGRP)
		fprintf(stderr,
			"members of group %s may connect (adduser "
			"USER %s, then log in again)\n",
			gname, gname);
	else
		fprintf(stderr,
			"only %s may connect (socket_mode in "
			"gpucmdd.conf, or SocketMode= of the socket unit)\n",
			uname);
}

/* Whether path exists and is not a socket: then say what it is. */
static bool say_not_socket(const char *path)
{
	struct stat st;

	if (stat(path, &st) != 0 || S_ISSOCK(st.st_mode))
		return false;
	fprintf(stderr,
		"gpucmd: %s is %s, not a socket: check --socket and "
		"$GPUCMD_SOCKET\n",
		path,
		S_ISDIR(st.st_mode) ? "a directory" :
		S_ISREG(st.st_mode) ? "a regular file" :
				      "a special file");
	return true;
}

static int connect_with(const struct tool_opts *o, const char *service,
			unsigned flags, struct gpucmd_conn **out)
{
	const char *path = tool_socket_path(o);
	char msg[512] = "";
	int r;

	if (service == NULL)
		service = o->service;
	r = gpucmd_connect_flags(path, service, o->connect_timeout_ms, flags,
				 out, msg, sizeof(msg));
	if (r == 0) {
		if (o->connect_timeout_ms != o->timeout_ms)
			gpucmd_set_timeout(*out, o->timeout_ms);
		return 0;
	}
	if (r == GPUCMD_ELIMIT) {
		/* At capacity: a retry later may get in, as with no daemon. */
		fprintf(stderr,
			"gpucmd: gpucmdd at %s takes no more "
			"connections now: %s\n",
			path, msg[0] != '\0' ? msg : gpucmd_strerror(r));
		return TOOL_EXIT_UNAVAILABLE;
	}
	if (tool_exit_status(r) == TOOL_EXIT_FAIL) {
		fprintf(stderr,
			"gpucmd: gpucmdd at %s refused service '%s' "
			"(%s): %s\n",
			path, service, gpucmd_errname(r),
			msg[0] != '\0' ? msg : gpucmd_strerror(r));
		return TOOL_EXIT_FAIL;
	}
	fprintf(stderr, "gpucmd: cannot reach gpucmdd at %s: %s\n", path,
		msg[0] != '\0' ? msg : gpucmd_strerror(r));
	if (r == -ENAMETOOLONG) {
		/* The caller's mistake, not a missing daemon. */
		fprintf(stderr, "gpucmd: give a shorter --socket path\n");
		return TOOL_EXIT_USAGE;
	}
	if (r == -EACCES || r == -EPERM)
		say_no_access(path);
	else if ((r == -ECONNREFUSED || r == -ENOTSOCK) && say_not_socket(path))
		return TOOL_EXIT_UNAVAILABLE;
	else if (r == GPUCMD_EPROTO)
		fprintf(stderr, "gpucmd: something else listens there: check "
				"--socket and $GPUCMD_SOCKET\n");
	else if (r == GPUCMD_EVERSION)
		fprintf(stderr,
			"gpucmd: use a gpucmd of the same release as "
			"the daemon (gpucmd --version, gpucmdd --version)\n");
	else if (r == -ETIMEDOUT)
		fprintf(stderr,
			"gpucmd: it may be stopped or wedged (see "
			"journalctl -u gpucmdd), or give a longer --timeout\n");
	else
		fprintf(stderr,
			"gpucmd: is gpucmdd running? (systemctl start "
			"gpucmdd.socket, or gpucmdd --socket PATH; in a "
			"source tree: make run)\n");
	return TOOL_EXIT_UNAVAILABLE;
}

int tool_connect(const struct tool_opts *o, const char *service,
		 struct gpucmd_conn **out)
{
	return connect_with(o, service, 0, out);
}

int tool_observe(const struct tool_opts *o, struct gpucmd_conn **out)
{
	return connect_with(o, NULL, GPUCMD_CONNECT_OBSERVE, out);
}

int tool_fail(const char *what, int code)
{
	return tool_fail_why(what, code, NULL);
}

int tool_fail_why(const char *what, int code, const char *why)
{
	fflush(stdout);
	if (why != NULL && why[0] != '\0' && code != GPUCMD_EDISCONNECTED)
		fprintf(stderr, "gpucmd: %s: %s (%s)\n", what, why,
			gpucmd_errname(code));
	else if (code == GPUCMD_EDISCONNECTED && why != NULL &&
		 why[0] != '\0' && strncmp(why, "the daemon closed", 17) != 0 &&
		 strcmp(why, gpucmd_strerror(code)) != 0)
		/* The daemon's reason (an eviction names who evicted). */
		fprintf(stderr,
			"gpucmd: %s: the daemon closed the connection: "
			"%s\n",
			what, why);
	else if (code == GPUCMD_EDISCONNECTED)
		fprintf(stderr,
			"gpucmd: %s: the daemon closed the connection\n", what);
	else if (code == -ETIMEDOUT && tool_timeout_ms >= 0)
		fprintf(stderr,
			"gpucmd: %s: the daemon did not answer within "
			"%.3g s; it may be wedged (see journalctl -u gpucmdd), "
			"or give a longer --timeout\n",
			what, tool_timeout_ms / 1000.0);
	else
		fprintf(stderr, "gpucmd: %s: %s (%s)\n", what,
			gpucmd_strerror(code), gpucmd_errname(code));
	return tool_exit_status(code);
}

int tool_fail_conn(const char *what, int code, const struct gpucmd_conn *conn)
{
	const char *why = NULL;

	if (code != GPUCMD_EDISCONNECTED || gpucmd_conn_error(conn, &why) == 0)
		why = gpucmd_last_message(conn);
	return tool_fail_why(what, code, why);
}

int tool_usage(const char *prog, const char *usage, int status,
	       const char *complaint, ...)
{
	FILE *f = status == TOOL_EXIT_OK ? stdout : stderr;
	va_list ap;

	if (complaint != NULL) {
		va_start(ap, complaint);
		fprintf(f, "%s: ", prog);
		vfprintf(f, complaint, ap);
		fputs("\n", f);
		va_end(ap);
	}
	fputs(usage, f);
	return status;
}

int tool_flags(int argc, char **argv, const char *usage, int *json, int *bytes)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "bytes", no_argument, NULL, 'b' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
		if (c == 'j')
			*json = 1;
		else if (c == 'b' && bytes != NULL)
			*bytes = 1;
		else if (c == 'b')
			return tool_usage(argv[0], usage, TOOL_EXIT_USAGE,
					  "--bytes is not an option of this "
					  "command");
		else if (c == 'h')
			return tool_usage(argv[0], usage, TOOL_EXIT_OK, NULL);
		else
			return tool_usage(argv[0], usage, TOOL_EXIT_USAGE,
					  NULL);
	}
	if (optind < argc)
		return tool_usage(argv[0], usage, TOOL_EXIT_USAGE,
				  "unexpected argument '%s'", argv[optind]);
	return -1;
}

/* Length of the valid UTF-8 sequence at s, or 0 when it is not one. */
static size_t utf8_len(const unsigned char *s)
{
	size_t n;
	uint32_t cp;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		n = 2, cp = s[0] & 0x1f;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		n = 3, cp = s[0] & 0x0f;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		n = 4, cp = s[0] & 0x07;
	else
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	/* Overlong forms, surrogates and values past U+10FFFF are invalid. */
	if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
	    (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
		return 0;
	return n;
}

/*
 * Names come from the daemon's configuration and messages from its code,
 * so nothing guarantees valid UTF-8: a byte that is not part of a valid
 * sequence becomes U+FFFD rather than making the whole line invalid JSON.
 */
void tool_json_string(FILE *f, const char *str)
{
	const unsigned char *s = (const unsigned char *)str;

	fputc('"', f);
	while (*s != '\0') {
		size_t n = utf8_len(s);

		if (n == 0) {
			fputs("\\ufffd", f);
			s++;
			continue;
		}
		switch (*s) {
		case '"':
			fputs("\\\"", f);
			break;
		case '\\':
			fputs("\\\\", f);
			break;
		case '\n':
			fputs("\\n", f);
			break;
		case '\r':
			fputs("\\r", f);
			break;
		case '\t':
			fputs("\\t", f);
			break;
		default:
			if (*s < 0x20)
				fprintf(f, "\\u%04x", *s);
			else
				fwrite(s, 1, n, f);
		}
		s += n;
	}
	fputc('"', f);
}

const char *tool_size(uint64_t bytes, int exact, char *buf, size_t len)
{
	static const char *const units[] = { "KiB", "MiB", "GiB",
					     "TiB", "PiB", "EiB" };
	double v = (double)bytes / 1024;
	size_t u = 0;

	if (exact || bytes < 1024) {
		snprintf(buf, len, exact ? "%" PRIu64 : "%" PRIu64 " B", bytes);
		return buf;
	}
	/* 1023.96 KiB would print as "1024.0 KiB": move up a unit first. */
	while (v >= 1023.95 && u + 1 < sizeof(units) / sizeof(units[0])) {
		v /= 1024;
		u++;
	}
	snprintf(buf, len, "%.1f %s", v, units[u]);
	return buf;
}

int tool_parse_u64(const char *s, int suffix, uint64_t *out)
{
	int base = 10;
	uint64_t v = 0, mult = 1;
	const char *digits;

	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
		base = 16;
		s += 2;
	}
	for (digits = s; *s != '\0'; s++) {
		unsigned d;

		if (*s >= '0' && *s <= '9')
			d = (unsigned)(*s - '0');
		else if (base == 16 && *s >= 'a' && *s <= 'f')
			d = (unsigned)(*s - 'a' + 10);
		else if (base == 16 && *s >= 'A' && *s <= 'F')
			d = (unsigned)(*s - 'A' + 10);
		else
			break;
		if (v > (UINT64_MAX - d) / (unsigned)base)
			return -1;
		v = v * (unsigned)base + d;
	}
	if (s == digits)
		return -1;
	if (suffix && *s != '\0' && s[1] == '\0') {
		switch (*s) {
		case 'k':
		case 'K':
			mult = 1ull << 10;
			break;
		case 'm':
		case 'M':
			mult = 1ull << 20;
			break;
		case 'g':
		case 'G':
			mult = 1ull << 30;
			break;
		default:
			return -1;
		}
		s++;
	}
	if (*s != '\0' || v > UINT64_MAX / mult)
		return -1;
	*out = v * mult;
	return 0;
}
