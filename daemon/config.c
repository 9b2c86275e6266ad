/*
 * config.c - defaults and value parsers of the daemon's settings.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpucmd.h"
#include "log.h"

void config_defaults(struct config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	snprintf(cfg->socket_path, sizeof(cfg->socket_path), "%s",
		 GPUCMD_DEFAULT_SOCKET);
	cfg->socket_mode = 0660;
	cfg->backend = CONFIG_BACKEND_AUTO;
	cfg->device = 0;
	cfg->host_memory = 4ull << 30;
	cfg->log_level = LOG_LEVEL_INFO;
	cfg->limits.max_connections = 256;
	cfg->limits.max_frame_bytes = 64u << 20;
	cfg->limits.max_ops_per_batch = 65536;
	cfg->limits.max_in_flight = 1024;
	cfg->limits.max_handles = 1u << 20;
	cfg->limits.max_streams = 16;
	cfg->limits.max_pending_bytes = 256ull << 20;
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

int config_parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	if (s == NULL || !isdigit((unsigned char)*s))
		return -1;
	errno = 0;
	v = strtoull(s, &end, 0);
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
