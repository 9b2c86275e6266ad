/*
 * config.h - the daemon's settings: defaults, then the config file
 * (gpucmdd.conf(5)), then command-line flags, in that order.
 *
 * Owner: main.c builds one struct config before the threads start; after
 * that it is read-only (a reload builds a new one and swaps the limits on the
 * loop thread).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Backend choice. */
enum config_backend {
	CONFIG_BACKEND_AUTO = 0,
	CONFIG_BACKEND_HOST = 1,
	CONFIG_BACKEND_CUDA = 2,
};

/* Every resource a client can consume has one of these. */
struct config_limits {
	uint32_t max_connections;	/* connections at once */
	uint32_t max_frame_bytes;	/* body of one frame */
	uint32_t max_ops_per_batch;
	uint32_t max_in_flight;		/* requests per connection not yet answered */
	uint32_t max_handles;		/* live handles per connection */
	uint32_t max_streams;		/* streams per connection */
	uint64_t max_pending_bytes;	/* replies queued to one slow reader */
};

struct config {
	char socket_path[108];
	uint32_t socket_mode;
	enum config_backend backend;
	int device;
	uint64_t host_memory;		/* host backend "device" size */
	uint64_t host_fail_alloc_at;	/* test hook, see driver.h */
	int log_level;
	struct config_limits limits;
};

/** Fill cfg with the built-in defaults. */
void config_defaults(struct config *cfg);
/** Parse "auto", "host", "cuda"; -1 when unknown. */
int config_backend_parse(const char *s);
/** Name of a backend choice. */
const char *config_backend_name(enum config_backend b);
/**
 * Parse a size with an optional K/M/G/T suffix (powers of 1024): 0, or -1
 * when s is not a size.
 */
int config_parse_size(const char *s, uint64_t *out);
