/*
 * fuzz_config.c - libFuzzer harness for the config file parser
 * (config_load over libinih, gpucmdd.conf(5)).
 *
 * The input is the file: it goes into a memfd and config_load reads it as
 * /proc/self/fd/N.  The harness checks what config.h promises:
 *   - on failure, the error says "PATH:..." and cfg keeps what it had;
 *   - on success, every limit is within the range the parser enforces,
 *     every [service NAME] has a valid name, names are unique, and the
 *     path is recorded;
 *   - config_copy of the result is equal to it, and config_free leaves no
 *     service list behind.
 * The first input byte picks whether the file is loaded over the defaults
 * or over a config that already lists a service (reload's case).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "gpucmd.h"
#include "log.h"
#include "service.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define expect(cond)                                                          \
	do {                                                                  \
		if (!(cond)) {                                                \
			fprintf(stderr, "fuzz_config: %s:%d: %s\n", __FILE__, \
				__LINE__, #cond);                             \
			abort();                                              \
		}                                                             \
	} while (0)

static int memfd = -1;
static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	memfd = memfd_create("gpucmdd.conf", MFD_CLOEXEC);
	expect(memfd >= 0);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", memfd);
	log_set_level(LOG_LEVEL_ERR);
	return 0;
}

static void check_limits(const struct config *c)
{
	const struct config_limits *l = &c->limits;

	expect(l->max_connections >= 1 && l->max_connections <= (1u << 20));
	expect(l->max_frame_bytes >= 4096 && l->max_frame_bytes <= (1u << 30));
	expect(l->max_ops_per_batch >= 1 && l->max_ops_per_batch <= (1u << 24));
	expect(l->max_in_flight >= 1 && l->max_in_flight <= (1u << 20));
	expect(l->max_handles >= 1 && l->max_handles <= (1u << 30));
	expect(l->max_streams >= 1 && l->max_streams <= 64);
	expect(l->max_pending_bytes >= 65536);
	expect(l->max_bytes_in_flight >= 65536);
	expect(c->host_memory >= (1u << 20));
	expect(c->socket_mode <= 0777);
	expect(c->device >= 0 && c->device <= 1024);
	expect(c->backend == CONFIG_BACKEND_AUTO ||
	       c->backend == CONFIG_BACKEND_HOST ||
	       c->backend == CONFIG_BACKEND_CUDA);
	expect(c->log_level >= LOG_LEVEL_ERR &&
	       c->log_level <= LOG_LEVEL_DEBUG);
	expect(strcmp(c->layout, "subslices") == 0 ||
	       strcmp(c->layout, "exclusive") == 0);
	expect(memchr(c->socket_path, '\0', sizeof(c->socket_path)) != NULL);
	expect(memchr(c->socket_group, '\0', sizeof(c->socket_group)) != NULL);
	expect(memchr(c->admin_group, '\0', sizeof(c->admin_group)) != NULL);
}

static void check_service(const struct config_service *s, bool named)
{
	expect(memchr(s->name, '\0', sizeof(s->name)) != NULL);
	if (named)
		expect(service_name_check(s->name) == 0);
	expect(s->max_streams <= 64);
	expect(s->weight <= 1000);
	expect(s->nuids <= CONFIG_MAX_IDS && s->ngids <= CONFIG_MAX_IDS);
}

static void base(struct config *c, bool with_service)
{
	config_defaults(c);
	if (!with_service)
		return;
	c->services = calloc(1, sizeof(*c->services));
	expect(c->services != NULL);
	c->nservices = 1;
	c->services[0] = c->default_service;
	snprintf(c->services[0].name, sizeof(c->services[0].name), "batch");
	c->services[0].memory_limit = 1u << 20;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct config cfg, before, copy;
	char err[512];
	bool with_service;
	int rc;

	if (size < 1)
		return 0;
	with_service = data[0] & 1;
	data++;
	size--;
	expect(ftruncate(memfd, 0) == 0);
	expect(pwrite(memfd, data, size, 0) == (ssize_t)size);

	base(&cfg, with_service);
	expect(config_copy(&before, &cfg) == 0);
	err[0] = '\0';
	rc = config_load(&cfg, path, err, sizeof(err));
	if (rc != 0) {
		expect(rc == GPUCMD_EINVAL);
		expect(strncmp(err, path, strlen(path)) == 0);
		expect(memchr(err, '\0', sizeof(err)) != NULL);
		/* "On failure cfg keeps what it had." */
		expect(cfg.nservices == before.nservices);
		expect(memcmp(&cfg.limits, &before.limits,
			      sizeof(cfg.limits)) == 0);
		expect(strcmp(cfg.socket_path, before.socket_path) == 0);
		expect(cfg.host_memory == before.host_memory);
		for (uint32_t i = 0; i < cfg.nservices; i++)
			expect(memcmp(&cfg.services[i], &before.services[i],
				      sizeof(cfg.services[i])) == 0);
	} else {
		expect(strcmp(cfg.path, path) == 0);
		check_limits(&cfg);
		check_service(&cfg.default_service, false);
		expect(cfg.nservices == 0 || cfg.services != NULL);
		for (uint32_t i = 0; i < cfg.nservices; i++) {
			check_service(&cfg.services[i], true);
			for (uint32_t j = 0; j < i; j++)
				expect(strcmp(cfg.services[i].name,
					      cfg.services[j].name) != 0);
			expect(config_find_service(&cfg,
						   cfg.services[i].name) ==
			       &cfg.services[i]);
		}
		expect(config_copy(&copy, &cfg) == 0);
		expect(copy.nservices == cfg.nservices);
		for (uint32_t i = 0; i < cfg.nservices; i++)
			expect(memcmp(&copy.services[i], &cfg.services[i],
				      sizeof(copy.services[i])) == 0);
		config_free(&copy);
		expect(copy.services == NULL && copy.nservices == 0);
	}
	config_free(&before);
	config_free(&cfg);
	expect(cfg.services == NULL && cfg.nservices == 0);
	return 0;
}
