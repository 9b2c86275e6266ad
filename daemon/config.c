/*
 * config.c - defaults and value parsers of the daemon's settings.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <ini.h>
#include <pwd.h>
#include <sys/stat.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "gpucmd.h"
#include "log.h"
#include "service.h"
#include "spin.h"

void config_defaults(struct config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	snprintf(cfg->socket_path, sizeof(cfg->socket_path), "%s",
		 GPUCMD_DEFAULT_SOCKET);
	cfg->socket_mode = 0660;
	cfg->backend = CONFIG_BACKEND_AUTO;
	cfg->device = 0;
	cfg->host_memory = 4ull << 30;
	cfg->pinned_memory = 256ull << 20;
	cfg->log_level = LOG_LEVEL_INFO;
	cfg->limits.max_connections = 256;
	cfg->limits.max_frame_bytes = 64u << 20;
	cfg->limits.max_ops_per_batch = 65536;
	cfg->limits.max_in_flight = 1024;
	cfg->limits.max_handles = 1u << 20;
	cfg->limits.max_streams = 16;
	cfg->limits.max_pending_bytes = 256ull << 20;
	cfg->limits.frame_timeout = 10;
	cfg->limits.max_bytes_in_flight = 256ull << 20;
	snprintf(cfg->layout, sizeof(cfg->layout), "subslices");
	cfg->spin_us = SPIN_DEFAULT_US;
	cfg->host_stream_nice = CONFIG_HOST_STREAM_NICE;
	cfg->stop_timeout = CONFIG_STOP_TIMEOUT;
	cfg->unknown_services = CONFIG_UNKNOWN_ALLOW;
	cfg->default_service.weight = 1;
	cfg->default_service.max_modules = CONFIG_DEFAULT_MAX_MODULES;
	cfg->default_service.max_bytes_in_flight =
		CONFIG_DEFAULT_SERVICE_BYTES_IN_FLIGHT;
}

int config_backend_parse(const char *s)
{
	if (strcmp(s, "auto") == 0)
		return CONFIG_BACKEND_AUTO;
	if (strcmp(s, "host") == 0)
		return CONFIG_BACKEND_HOST;
	if (strcmp(s, "cuda") == 0)
		return CONFIG_BACKEND_CUDA;
	return -1;
}

const char *config_file(const struct config *cfg)
{
	return cfg->path[0] ? cfg->path : CONFIG_DEFAULT_PATH;
}

const char *config_backend_name(enum config_backend b)
{
	switch (b) {
	case CONFIG_BACKEND_HOST:
		return "host";
	case CONFIG_BACKEND_CUDA:
		return "cuda";
	case CONFIG_BACKEND_AUTO:
		break;
	}
	return "auto";
}

int config_parse_device(const char *s, int *index, char *id, size_t id_len)
{
	bool uuid = strncasecmp(s, "GPU-", 4) == 0;
	const char *p = uuid ? s + 4 : s;
	size_t n = strlen(s);
	uint64_t x;

	/*
	 * nvidia-smi -L lists MIG instances by these too, but CUDA numbers
	 * at most one of them, and only when CUDA_VISIBLE_DEVICES names it.
	 */
	if (strncasecmp(s, "MIG-", 4) == 0)
		return -2;
	if (n > 0 && strspn(s, "0123456789") == n) {
		if (config_parse_size(s, &x) != 0 || x > 1024)
			return -1;
		*index = (int)x;
		id[0] = '\0';
		return 0;
	}
	/* A UUID's hex digits and dashes; a bus id's, colons and a dot. */
	if (n >= id_len || *p == '\0' ||
	    strspn(p, uuid ? "0123456789abcdefABCDEF-" :
			     "0123456789abcdefABCDEF:.") != strlen(p) ||
	    (!uuid && strchr(s, ':') == NULL))
		return -1;
	*index = 0;
	snprintf(id, id_len, "%s", s);
	return 0;
}

int config_parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	if (s == NULL || !isdigit((unsigned char)*s))
		return -1;
	errno = 0;
	/* Decimal, or hex after 0x: "010G" is ten GiB, not octal eight. */
	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
		v = strtoull(s, &end, 16);
	else
		v = strtoull(s, &end, 10);
	if (errno != 0)
		return -1;
	switch (toupper((unsigned char)*end)) {
	case 'K':
		shift = 10;
		break;
	case 'M':
		shift = 20;
		break;
	case 'G':
		shift = 30;
		break;
	case 'T':
		shift = 40;
		break;
	case '\0':
		break;
	default:
		return -1;
	}
	if (shift != 0) {
		end++;
		if (toupper((unsigned char)*end) == 'I')
			end++;
		if (toupper((unsigned char)*end) == 'B')
			end++;
	}
	if (*end != '\0')
		return -1;
	if (shift != 0 && v > (UINT64_MAX >> shift))
		return -1;
	*out = (uint64_t)v << shift;
	return 0;
}

/* ---- the file -------------------------------------------------------------- */

/* Service names as the reader found them: inih cuts long section names. */
#define LOAD_MAX_SECTIONS 4096

struct load_state {
	struct config *cfg;
	FILE *f;
	int line;      /* of the line inih is handling */
	char err[256]; /* the first problem... */
	int err_line;  /* ...and its line */
	bool failed;
	uint32_t nnames;
	char (*names)[64];     /* [service NAME] headers, by index */
	uint32_t services_cap; /* room in cfg->services */
	char invalid[96];  /* the last invalid header, reported at its keys */
	int invalid_line;  /* its line, for a section without keys */
	bool invalid_seen; /* a key of it was reported */
};

/* Record the first problem and tell inih the line failed. */
static int bad(struct load_state *st, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int bad(struct load_state *st, const char *fmt, ...)
{
	va_list ap;

	if (!st->failed) {
		va_start(ap, fmt);
		vsnprintf(st->err, sizeof(st->err), fmt, ap);
		va_end(ap);
		st->failed = true;
		st->err_line = st->line;
	}
	return 0;
}

static int set_u32(struct load_state *st, const char *name, const char *v,
		   uint64_t min, uint64_t max, uint32_t *out)
{
	uint64_t x;

	if (config_parse_size(v, &x) != 0 || x < min || x > max)
		return bad(st, "%s = %s: expected a number from %llu to %llu",
			   name, v, (unsigned long long)min,
			   (unsigned long long)max);
	*out = (uint32_t)x;
	return 1;
}

static int set_size(struct load_state *st, const char *name, const char *v,
		    uint64_t min, uint64_t *out)
{
	uint64_t x;

	if (config_parse_size(v, &x) != 0 || x < min)
		return bad(st,
			   "%s = %s: expected a size of at least %llu "
			   "bytes (suffixes K, M, G, T)",
			   name, v, (unsigned long long)min);
	*out = x;
	return 1;
}

static int set_str(struct load_state *st, const char *name, const char *v,
		   char *out, size_t out_len)
{
	if (strlen(v) >= out_len)
		return bad(st, "%s is longer than %zu characters", name,
			   out_len - 1);
	snprintf(out, out_len, "%s", v);
	return 1;
}

/*
 * uids = 1000, alice  /  gids = 100, video.  The key again (in the same
 * section or another of the same name) adds to the list, so a long one
 * can take several lines.  An empty list is refused: it would read as
 * "anyone" and override the [services] defaults.
 */
static int set_ids(struct load_state *st, const char *name, const char *v,
		   bool groups, uint32_t *ids, uint32_t *n)
{
	char buf[1024];
	char *save = NULL;
	bool any = false;

	if (strlen(v) >= sizeof(buf))
		return bad(st, "%s is too long", name);
	snprintf(buf, sizeof(buf), "%s", v);
	for (char *tok = strtok_r(buf, ", \t", &save); tok != NULL;
	     tok = strtok_r(NULL, ", \t", &save)) {
		char *end;
		unsigned long long id;

		errno = 0;
		id = strtoull(tok, &end, 10);
		any = true;
		if (*n == CONFIG_MAX_IDS)
			return bad(st,
				   "%s lists more than %d ids (all its "
				   "lines together)",
				   name, CONFIG_MAX_IDS);
		if (*end != '\0' || end == tok) {
			if (groups) {
				struct group *g = getgrnam(tok);
				if (g == NULL)
					return bad(st,
						   "%s: no group named '%s'",
						   name, tok);
				id = g->gr_gid;
			} else {
				struct passwd *p = getpwnam(tok);
				if (p == NULL)
					return bad(st, "%s: no user named '%s'",
						   name, tok);
				id = p->pw_uid;
			}
		} else if (errno != 0 || id >= UINT32_MAX) {
			return bad(st, "%s: id %s is out of range (0 to %u)",
				   name, tok, UINT32_MAX - 1);
		}
		ids[(*n)++] = (uint32_t)id;
	}
	if (!any)
		return bad(st,
			   "%s is empty: list at least one %s, or leave "
			   "the key out (a service section then takes the "
			   "[services] default_uids and default_gids; "
			   "without any, anyone may connect)",
			   name, groups ? "group" : "user");
	return 1;
}

/*
 * A key of a [service NAME] section, or of [services] with its default_
 * prefix (key is then the whole key as written, name without the prefix):
 * messages name the key the file has.
 */
static int service_key(struct load_state *st, struct config_service *svc,
		       const char *key, const char *name, const char *v)
{
	if (strcmp(name, "memory_limit") == 0) {
		svc->set |= CONFIG_SET_MEMORY_LIMIT;
		return set_size(st, key, v, 0, &svc->memory_limit);
	}
	if (strcmp(name, "region_limit") == 0) {
		svc->set |= CONFIG_SET_REGION_LIMIT;
		return set_size(st, key, v, 0, &svc->region_limit);
	}
	if (strcmp(name, "max_streams") == 0) {
		svc->set |= CONFIG_SET_MAX_STREAMS;
		return set_u32(st, key, v, 1, 64, &svc->max_streams);
	}
	if (strcmp(name, "max_modules") == 0) {
		svc->set |= CONFIG_SET_MAX_MODULES;
		return set_u32(st, key, v, 0, CONFIG_MAX_MODULES_MAX,
			       &svc->max_modules);
	}
	if (strcmp(name, "weight") == 0) {
		svc->set |= CONFIG_SET_WEIGHT;
		return set_u32(st, key, v, 1, 1000, &svc->weight);
	}
	if (strcmp(name, "max_bytes_in_flight") == 0) {
		svc->set |= CONFIG_SET_BYTES_IN_FLIGHT;
		return set_size(st, key, v, 0, &svc->max_bytes_in_flight);
	}
	if (strcmp(name, "max_connections") == 0) {
		svc->set |= CONFIG_SET_MAX_CONNECTIONS;
		return set_u32(st, key, v, 0, 1048576, &svc->max_connections);
	}
	if (strcmp(name, "uids") == 0) {
		svc->set |= CONFIG_SET_UIDS;
		return set_ids(st, key, v, false, svc->uids, &svc->nuids);
	}
	if (strcmp(name, "gids") == 0) {
		svc->set |= CONFIG_SET_GIDS;
		return set_ids(st, key, v, true, svc->gids, &svc->ngids);
	}
	if (key != name)
		return bad(st,
			   "unknown key '%s' in [services] (unknown, "
			   "default_memory_limit, default_region_limit, "
			   "default_max_streams, default_max_modules, "
			   "default_weight, default_max_bytes_in_flight, "
			   "default_max_connections, default_uids, "
			   "default_gids)",
			   key);
	return bad(st,
		   "unknown key '%s' in a service section (memory_limit, "
		   "region_limit, max_streams, max_modules, weight, "
		   "max_bytes_in_flight, max_connections, uids, gids)",
		   name);
}

/* The service a "[service #N]" header (see read_line) stands for. */
static struct config_service *section_service(struct load_state *st,
					      const char *section)
{
	struct config *cfg = st->cfg;
	unsigned long idx = strtoul(section + strlen("service #"), NULL, 10);

	if (idx >= st->nnames)
		return NULL;
	return (struct config_service *)config_find_service(cfg,
							    st->names[idx]);
}

/* Declare the service name (an empty section still configures it). */
static int declare_service(struct load_state *st, const char *name)
{
	struct config *cfg = st->cfg;
	struct config_service *svc;

	if (config_find_service(cfg, name) != NULL)
		return 0;
	if (cfg->nservices >= CONFIG_MAX_SERVICES)
		return GPUCMD_ELIMIT;
	/*
	 * Room doubles: a file of LOAD_MAX_SECTIONS sections grew it one at
	 * a time, each a copy of all before (seconds under TSan, whose
	 * realloc maps anew).
	 */
	if (cfg->nservices == st->services_cap) {
		uint32_t cap = st->services_cap < 8 ? 8 : 2 * st->services_cap;

		svc = realloc(cfg->services, cap * sizeof(*svc));
		if (svc == NULL)
			return GPUCMD_ENOMEM;
		cfg->services = svc;
		st->services_cap = cap;
	}
	svc = &cfg->services[cfg->nservices++];
	memset(svc, 0, sizeof(*svc));
	snprintf(svc->name, sizeof(svc->name), "%s", name);
	return 0;
}

/*
 * Is line a "[service NAME]" header (NAME optionally in double quotes)?
 * The name goes to name, untrimmed of nothing but its quotes and blanks.
 */
static bool service_header(const char *line, char *name, size_t name_len)
{
	const char *p = line, *end;
	size_t n;

	while (*p == ' ' || *p == '\t')
		p++;
	if (strncmp(p, "[service", 8) != 0 || (p[8] != ' ' && p[8] != '\t'))
		return false;
	p += 8;
	while (*p == ' ' || *p == '\t')
		p++;
	end = strchr(p, ']');
	if (end == NULL)
		return false;
	while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
		end--;
	if (end - p >= 2 && *p == '"' && end[-1] == '"') {
		p++;
		end--;
	}
	n = (size_t)(end - p);
	if (n >= name_len)
		n = name_len - 1;
	memcpy(name, p, n);
	name[n] = '\0';
	return true;
}

/* Is line a "[NAME]" header of any other kind? */
static bool other_header(const char *line, char *name, size_t name_len)
{
	const char *p = line, *end;
	size_t n;

	while (*p == ' ' || *p == '\t')
		p++;
	if (*p != '[')
		return false;
	end = strchr(++p, ']');
	if (end == NULL)
		return false;
	n = (size_t)(end - p);
	if (n >= name_len)
		n = name_len - 1;
	memcpy(name, p, n);
	name[n] = '\0';
	return true;
}

/*
 * inih's reader: hands inih one line at a time, counting lines (so handler
 * errors get theirs) and rewriting each "[service NAME]" header to
 * "[service #N]": inih keeps only 50 characters of a section name, and
 * sections with no keys never reach the handler, yet both must count.
 */
static char *read_line(char *str, int num, void *stream)
{
	struct load_state *st = stream;
	char line[1024], name[1024];
	const char *start;
	size_t len;
	int rc;

	if (fgets(line, sizeof(line), st->f) == NULL)
		return NULL;
	st->line++;
	len = strlen(line);
	if (len == sizeof(line) - 1 && line[len - 1] != '\n') {
		bad(st, "line is longer than %zu characters", sizeof(line) - 2);
		while (fgets(line, sizeof(line), st->f) != NULL &&
		       line[strlen(line) - 1] != '\n')
			;
		snprintf(str, (size_t)num, "\n");
		return str;
	}
	if (service_header(line, name, sizeof(name))) {
		if (strlen(name) > 63 || service_name_check(name) != 0) {
			/* Reported at its first key (or at the end). */
			snprintf(st->invalid, sizeof(st->invalid), "%.80s",
				 name);
			st->invalid_line = st->line;
			st->invalid_seen = false;
		} else if (st->nnames >= LOAD_MAX_SECTIONS) {
			bad(st, "more than %d service sections",
			    LOAD_MAX_SECTIONS);
		} else if ((rc = declare_service(st, name)) != 0) {
			/*
			 * The daemon keeps that many services and never
			 * retires a listed one: past it, services listed
			 * could never connect.
			 */
			if (rc == GPUCMD_ELIMIT)
				bad(st,
				    "[service %.63s]: more than %d "
				    "services, the most the daemon keeps",
				    name, CONFIG_MAX_SERVICES);
			else
				bad(st, "out of memory");
		} else {
			snprintf(st->names[st->nnames], sizeof(st->names[0]),
				 "%s", name);
			snprintf(str, (size_t)num, "[service #%u]\n",
				 st->nnames++);
			return str;
		}
		snprintf(str, (size_t)num, "[service #invalid]\n");
		return str;
	}
	/*
	 * inih (built with INI_ALLOW_MULTILINE) reads an indented line after
	 * a key as that key given again with the line as its whole value:
	 * "uids = root, alice" then "  bob" would leave bob alone, and
	 * "memory_limit = 1G" then "  64G" would be 64G.  Blanks at the start
	 * of a line are dropped here, so that an indented key is a key, and
	 * an indented line that holds no key is refused.
	 */
	start = line + strspn(line, " \t");
	if (start != line) {
		if (strchr(";#[\r\n", *start) == NULL &&
		    strpbrk(start, "=:") == NULL)
			bad(st, "an indented line without a key: continuation "
				"lines are not read; give the key again on a "
				"line of its own (uids and gids lists add up)");
		len = strlen(start);
		memmove(line, start, len + 1);
	}
	if (other_header(line, name, sizeof(name)) &&
	    strcmp(name, "daemon") != 0 && strcmp(name, "limits") != 0 &&
	    strcmp(name, "services") != 0)
		bad(st,
		    "unknown section [%.80s] (daemon, limits, services, "
		    "service NAME)",
		    name);
	if ((int)len >= num) {
		bad(st, "line is longer than %d characters", num - 2);
		snprintf(str, (size_t)num, "\n");
		return str;
	}
	memcpy(str, line, len + 1);
	return str;
}

/* Services take [services] default_* for every key they did not set. */
static void apply_service_defaults(struct config *cfg)
{
	const struct config_service *d = &cfg->default_service;

	for (uint32_t i = 0; i < cfg->nservices; i++) {
		struct config_service *svc = &cfg->services[i];

		if (!(svc->set & CONFIG_SET_MEMORY_LIMIT))
			svc->memory_limit = d->memory_limit;
		if (!(svc->set & CONFIG_SET_REGION_LIMIT))
			svc->region_limit = d->region_limit;
		if (!(svc->set & CONFIG_SET_MAX_STREAMS))
			svc->max_streams = d->max_streams;
		if (!(svc->set & CONFIG_SET_MAX_MODULES))
			svc->max_modules = d->max_modules;
		if (!(svc->set & CONFIG_SET_WEIGHT))
			svc->weight = d->weight;
		if (!(svc->set & CONFIG_SET_BYTES_IN_FLIGHT))
			svc->max_bytes_in_flight = d->max_bytes_in_flight;
		if (!(svc->set & CONFIG_SET_MAX_CONNECTIONS))
			svc->max_connections = d->max_connections;
		/*
		 * Who may connect is one rule: a section that names its
		 * users or its groups replaces both defaults, or a section
		 * with gids alone would also admit default_uids.
		 */
		if (!(svc->set & (CONFIG_SET_UIDS | CONFIG_SET_GIDS))) {
			svc->nuids = d->nuids;
			memcpy(svc->uids, d->uids, sizeof(svc->uids));
			svc->ngids = d->ngids;
			memcpy(svc->gids, d->gids, sizeof(svc->gids));
		}
	}
}

static int handle_key(void *user, const char *section, const char *name,
		      const char *v)
{
	struct load_state *st = user;
	struct config *cfg = st->cfg;
	struct config_limits *lim = &cfg->limits;
	int x;

	if (strcmp(section, "daemon") == 0) {
		if (strcmp(name, "socket") == 0) {
			if (*v == '\0')
				return bad(st, "socket = : give the socket's "
					       "path, or leave the key out for "
					       "the default");
			return set_str(st, name, v, cfg->socket_path,
				       sizeof(cfg->socket_path));
		}
		if (strcmp(name, "socket_mode") == 0) {
			char *end;
			unsigned long m = strtoul(v, &end, 8);
			if (*v == '\0' || *end != '\0' || m > 0777)
				return bad(st,
					   "socket_mode = %s: expected an "
					   "octal mode like 0660",
					   v);
			cfg->socket_mode = (uint32_t)m;
			return 1;
		}
		if (strcmp(name, "socket_group") == 0)
			return set_str(st, name, v, cfg->socket_group,
				       sizeof(cfg->socket_group));
		if (strcmp(name, "admin_group") == 0)
			return set_str(st, name, v, cfg->admin_group,
				       sizeof(cfg->admin_group));
		if (strcmp(name, "backend") == 0) {
			x = config_backend_parse(v);
			if (x < 0)
				return bad(st,
					   "backend = %s: expected auto, "
					   "cuda or host",
					   v);
			cfg->backend = (enum config_backend)x;
			return 1;
		}
		if (strcmp(name, "device") == 0) {
			int rc = config_parse_device(v, &cfg->device,
						     cfg->device_id,
						     sizeof(cfg->device_id));

			if (rc == -2)
				return bad(st,
					   "device = %s: a MIG instance is "
					   "chosen by CUDA_VISIBLE_DEVICES=%s "
					   "in gpucmdd's environment "
					   "(Environment= in its unit), where "
					   "CUDA numbers it 0: set that and "
					   "remove this line",
					   v, v);
			if (rc != 0)
				return bad(st,
					   "device = %s: expected an index "
					   "from 0 to 1024, a GPU UUID "
					   "(GPU-...) or a PCI bus id "
					   "(0000:3b:00.0), as nvidia-smi -L "
					   "and nvidia-smi -q print them",
					   v);
			return 1;
		}
		if (strcmp(name, "host_memory") == 0)
			return set_size(st, name, v, 1u << 20,
					&cfg->host_memory);
		if (strcmp(name, "pinned_memory") == 0)
			return set_size(st, name, v, 0, &cfg->pinned_memory);
		if (strcmp(name, "log_level") == 0) {
			x = log_level_parse(v);
			if (x < 0)
				return bad(st,
					   "log_level = %s: expected "
					   "error, warning, notice, info or "
					   "debug",
					   v);
			cfg->log_level = x;
			return 1;
		}
		if (strcmp(name, "spin_us") == 0)
			return set_u32(st, name, v, 0, SPIN_MAX_US,
				       &cfg->spin_us);
		if (strcmp(name, "host_stream_nice") == 0)
			return set_u32(st, name, v, 0, 19,
				       &cfg->host_stream_nice);
		if (strcmp(name, "stop_timeout") == 0)
			return set_u32(st, name, v, 0, CONFIG_STOP_TIMEOUT_MAX,
				       &cfg->stop_timeout);
		if (strcmp(name, "layout") == 0) {
			if (strcmp(v, "subslices") != 0 &&
			    strcmp(v, "exclusive") != 0)
				return bad(st,
					   "layout = %s: expected "
					   "subslices or exclusive",
					   v);
			return set_str(st, name, v, cfg->layout,
				       sizeof(cfg->layout));
		}
		return bad(st, "unknown key '%s' in [daemon]", name);
	}
	if (strcmp(section, "limits") == 0) {
		if (strcmp(name, "max_connections") == 0)
			return set_u32(st, name, v, 1, 1u << 20,
				       &lim->max_connections);
		if (strcmp(name, "max_frame_bytes") == 0)
			return set_u32(st, name, v, 4096, 1u << 30,
				       &lim->max_frame_bytes);
		if (strcmp(name, "max_ops_per_batch") == 0)
			return set_u32(st, name, v, 1, 1u << 24,
				       &lim->max_ops_per_batch);
		if (strcmp(name, "max_in_flight") == 0)
			return set_u32(st, name, v, 1, 1u << 20,
				       &lim->max_in_flight);
		if (strcmp(name, "max_handles") == 0)
			return set_u32(st, name, v, 1, 1u << 30,
				       &lim->max_handles);
		if (strcmp(name, "max_streams") == 0)
			return set_u32(st, name, v, 1, 64, &lim->max_streams);
		if (strcmp(name, "max_pending_bytes") == 0)
			return set_size(st, name, v, 65536,
					&lim->max_pending_bytes);
		if (strcmp(name, "max_bytes_in_flight") == 0)
			return set_size(st, name, v, 65536,
					&lim->max_bytes_in_flight);
		if (strcmp(name, "frame_timeout") == 0)
			return set_u32(st, name, v, 0, 3600,
				       &lim->frame_timeout);
		return bad(st, "unknown key '%s' in [limits]", name);
	}
	if (strcmp(section, "services") == 0) {
		if (strcmp(name, "unknown") == 0) {
			if (strcmp(v, "allow") == 0)
				cfg->unknown_services = CONFIG_UNKNOWN_ALLOW;
			else if (strcmp(v, "refuse") == 0)
				cfg->unknown_services = CONFIG_UNKNOWN_REFUSE;
			else
				return bad(st,
					   "unknown = %s: expected allow "
					   "or refuse",
					   v);
			return 1;
		}
		if (strncmp(name, "default_", 8) == 0)
			return service_key(st, &cfg->default_service, name,
					   name + 8, v);
		return bad(st,
			   "unknown key '%s' in [services] (unknown, "
			   "default_memory_limit, default_region_limit, "
			   "default_max_streams, default_max_modules, "
			   "default_weight, default_max_bytes_in_flight, "
			   "default_max_connections, default_uids, "
			   "default_gids)",
			   name);
	}
	if (strncmp(section, "service #", 9) == 0) {
		struct config_service *svc = section_service(st, section);

		if (svc == NULL) {
			st->invalid_seen = true;
			return bad(
				st,
				"[service %s]: '%s' is not a valid "
				"service name (1 to 63 letters, digits, '.', "
				"'_', '-')",
				st->invalid, st->invalid);
		}
		return service_key(st, svc, name, name, v);
	}
	if (section[0] == '\0')
		return bad(st,
			   "'%s' comes before any section: put it under "
			   "[daemon], [limits], [services] or [service NAME]",
			   name);
	return bad(st,
		   "unknown section [%s] (daemon, limits, services, "
		   "service NAME)",
		   section);
}

int config_load(struct config *cfg, const char *path, char *err, size_t err_len)
{
	struct config work;
	struct load_state st = { .cfg = &work };
	struct stat sb;
	int line;

	st.f = fopen(path, "re");
	if (st.f == NULL) {
		int e = errno;
		snprintf(err, err_len, "%s: %s", path, strerror(e));
		return -e;
	}
	if (fstat(fileno(st.f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
		snprintf(err, err_len, "%s: not a regular file", path);
		fclose(st.f);
		return GPUCMD_EINVAL;
	}
	st.names = calloc(LOAD_MAX_SECTIONS, sizeof(*st.names));
	if (st.names == NULL || config_copy(&work, cfg) != 0) {
		snprintf(err, err_len, "%s: out of memory", path);
		free(st.names);
		fclose(st.f);
		return -ENOMEM;
	}
	st.services_cap = work.nservices; /* config_copy: exactly that */
	line = ini_parse_stream(read_line, &st, handle_key, &st);
	fclose(st.f);
	free(st.names);
	if (st.invalid_line != 0 && !st.invalid_seen && !st.failed) {
		st.line = st.invalid_line;
		bad(&st,
		    "[service %s]: '%s' is not a valid service name (1 "
		    "to 63 letters, digits, '.', '_', '-')",
		    st.invalid, st.invalid);
	}
	/* The first problem wins, whoever saw it. */
	if (st.failed && (line == 0 || st.err_line < line))
		line = st.err_line;
	if (line != 0) {
		if (line < 0)
			snprintf(err, err_len, "%s: cannot read the file",
				 path);
		else if (st.failed && st.err_line == line)
			snprintf(err, err_len, "%s:%d: %s", path, line, st.err);
		else
			snprintf(err, err_len,
				 "%s:%d: syntax error (expected "
				 "[section], key = value or a ; comment)",
				 path, line);
		config_free(&work);
		return GPUCMD_EINVAL;
	}
	apply_service_defaults(&work);
	snprintf(work.path, sizeof(work.path), "%s", path);
	config_free(cfg);
	*cfg = work;
	return 0;
}

void config_free(struct config *cfg)
{
	free(cfg->services);
	cfg->services = NULL;
	cfg->nservices = 0;
}

int config_copy(struct config *dst, const struct config *src)
{
	*dst = *src;
	dst->services = NULL;
	if (src->nservices == 0)
		return 0;
	dst->services = malloc(src->nservices * sizeof(*dst->services));
	if (dst->services == NULL) {
		dst->nservices = 0;
		return -ENOMEM;
	}
	memcpy(dst->services, src->services,
	       src->nservices * sizeof(*dst->services));
	return 0;
}

const struct config_service *config_find_service(const struct config *cfg,
						 const char *name)
{
	for (uint32_t i = 0; i < cfg->nservices; i++)
		if (strcmp(cfg->services[i].name, name) == 0)
			return &cfg->services[i];
	return NULL;
}
