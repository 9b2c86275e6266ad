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
	uint32_t max_connections; /* connections at once */
	uint32_t max_frame_bytes; /* body of one frame */
	uint32_t max_ops_per_batch;
	uint32_t max_in_flight; /* requests per connection not yet answered */
	uint32_t max_handles;	/* live handles per connection */
	uint32_t max_streams;	/* streams per connection */
	uint64_t max_pending_bytes; /* replies queued to one slow reader */
	/*
	 * Request and inline read bytes of one connection's batches not yet
	 * completed (session.c); one request alone always goes.
	 */
	uint64_t max_bytes_in_flight;
	/*
	 * Seconds, plus one for each SESSION_FRAME_MIB_PER_S MiB of its body,
	 * within which a frame larger than the read buffer must arrive whole
	 * once its header came (session_expire_frame); 0 = no limit.
	 */
	uint32_t frame_timeout;
};

#define CONFIG_MAX_IDS 32
/* Distinct [service NAME] sections: the registry's size (SERVICE_MAX). */
#define CONFIG_MAX_SERVICES 1024
#define CONFIG_DEFAULT_PATH "/etc/gpucmd/gpucmdd.conf"
/* Default [daemon] host_stream_nice: how much nicer host workers run. */
#define CONFIG_HOST_STREAM_NICE 10
/*
 * Default [daemon] stop_timeout: seconds a stop waits for the batches in
 * flight before the daemon exits 1 anyway, naming who held it up.  Below
 * the packaged units' TimeoutStopSec=90 with room to spare, so that the
 * daemon's own line, not a bare SIGKILL, ends a stop that runs over.
 */
#define CONFIG_STOP_TIMEOUT 60
/* The largest stop_timeout (0 turns the deadline off instead). */
#define CONFIG_STOP_TIMEOUT_MAX 3600

/* A [service NAME] section. */
struct config_service {
	char name[64];
	uint64_t memory_limit;	      /* bytes, 0 = none */
	uint64_t region_limit;	      /* bytes of shared regions, 0 = none */
	uint32_t max_streams;	      /* 0 = the daemon's limit */
	uint32_t max_modules;	      /* loaded at once, 0 = built-ins only */
	uint32_t weight;	      /* share of the device thread, 1..1000 */
	uint64_t max_bytes_in_flight; /* all its connections, 0 = none */
	uint32_t max_connections;     /* open at once, 0 = [limits]' only */
	uint32_t nuids;
	uint32_t ngids;
	uint32_t uids
		[CONFIG_MAX_IDS]; /* who may connect as it (empty: anyone) */
	uint32_t gids[CONFIG_MAX_IDS];
	uint32_t set; /* CONFIG_SET_*: keys the section gave */
};

#define CONFIG_SET_MEMORY_LIMIT 1u
#define CONFIG_SET_MAX_STREAMS 2u
#define CONFIG_SET_WEIGHT 4u
#define CONFIG_SET_UIDS 8u
#define CONFIG_SET_GIDS 16u
#define CONFIG_SET_REGION_LIMIT 32u
#define CONFIG_SET_MAX_MODULES 64u
#define CONFIG_SET_BYTES_IN_FLIGHT 128u
#define CONFIG_SET_MAX_CONNECTIONS 256u

/*
 * Default [services] default_max_bytes_in_flight: what all the connections
 * of one service may hold in the daemon at once (each also keeps to
 * [limits] max_bytes_in_flight).  Without it, a client opening many
 * connections could make the daemon hold max_connections x 256M.
 */
#define CONFIG_DEFAULT_SERVICE_BYTES_IN_FLIGHT (1ull << 30)

/*
 * Default [services] default_max_modules: distinct modules a service keeps
 * loaded at once.  The daemon-wide cache holds MODULE_CACHE_MAX (1024) and
 * evicts only modules nobody holds, so fewer than sixteen services at this
 * default cannot fill it (under unknown = allow a client may invent more:
 * gpucmdd.conf(5) says to refuse unknown services where that matters).
 */
#define CONFIG_DEFAULT_MAX_MODULES 64
/* The largest max_modules: the cache's size (MODULE_CACHE_MAX). */
#define CONFIG_MAX_MODULES_MAX 1024

/* What happens to a Hello naming a service the file does not list. */
enum config_unknown {
	CONFIG_UNKNOWN_ALLOW = 0, /* created with the default limits */
	CONFIG_UNKNOWN_REFUSE = 1,
};

struct config {
	char path[256]; /* the file read, "" when none */
	char socket_path[108];
	uint32_t socket_mode;
	char socket_group[64]; /* "" = leave the group alone */
	char admin_group[64];  /* members see every service */
	enum config_backend backend;
	int device;
	/* The device by "GPU-" UUID (prefix) or PCI bus id; "": by index. */
	char device_id[64];
	uint64_t host_memory;		/* host backend "device" size */
	uint64_t pinned_memory;		/* budget of the pinned host pool */
	uint64_t host_fail_alloc_at;	/* test hook, see driver.h */
	unsigned test_compile_delay_ms; /* test hook, see driver.h */
	int log_level;
	char layout[16];  /* default pool layout: subslices, exclusive */
	uint32_t spin_us; /* busy wait before a thread sleeps (spin.h) */
	uint32_t host_stream_nice; /* host backend workers' nice (driver.h) */
	uint32_t stop_timeout;	   /* seconds a stop drains, 0 = no limit */
	struct config_limits limits;
	enum config_unknown unknown_services;
	struct config_service default_service; /* limits of unlisted services */
	uint32_t nservices;
	struct config_service *services; /* malloc'ed */
};

/** Fill cfg with the built-in defaults. */
void config_defaults(struct config *cfg);
/**
 * Read the INI file at path over cfg (which holds defaults).  0, or
 * GPUCMD_EINVAL with "PATH:LINE: problem" in err; -ENOENT when the file is
 * missing.  On failure cfg keeps what it had.
 */
int config_load(struct config *cfg, const char *path, char *err,
		size_t err_len);
/** Free what config_load allocated. */
void config_free(struct config *cfg);
/** Deep copy src into dst (dst is overwritten, not freed). */
int config_copy(struct config *dst, const struct config *src);
/** The [service NAME] section for name, or NULL. */
const struct config_service *config_find_service(const struct config *cfg,
						 const char *name);
/** Parse "auto", "host", "cuda"; -1 when unknown. */
int config_backend_parse(const char *s);
/** Name of a backend choice. */
const char *config_backend_name(enum config_backend b);
/** The file cfg was read from, or would be (the default place), for messages. */
const char *config_file(const struct config *cfg);
/**
 * Parse a size with an optional K/M/G/T suffix (powers of 1024): 0, or -1
 * when s is not a size.
 */
int config_parse_size(const char *s, uint64_t *out);
/**
 * Parse a device: an index from 0 to 1024 (into *index, id emptied), or a
 * "GPU-" UUID or a prefix of one, or a PCI bus id such as 0000:3b:00.0
 * (into id, *index 0).  0; -2 when s is a MIG instance's UUID (MIG-...),
 * which only CUDA_VISIBLE_DEVICES chooses; -1 when s is none of these.
 */
int config_parse_device(const char *s, int *index, char *id, size_t id_len);
