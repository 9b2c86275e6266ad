/*
 * error.c - names and descriptions of the error codes in gpucmd.h.  Shared
 * by the daemon (log lines) and the client library (gpucmd_strerror).
 */
#include <string.h>

#include "gpucmd.h"

struct error_name {
	int code;
	const char *name;
	const char *text;
};

static const struct error_name errors[] = {
	{ GPUCMD_OK, "GPUCMD_OK", "success" },
	{ GPUCMD_ENOTFOUND, "GPUCMD_ENOTFOUND", "storage handle not found" },
	{ GPUCMD_ETOOBIG, "GPUCMD_ETOOBIG", "buffer too big" },
	{ GPUCMD_ENOMEM, "GPUCMD_ENOMEM",
	  "out of memory (the device's, or the daemon's host memory)" },
	{ GPUCMD_ECAPACITY, "GPUCMD_ECAPACITY", "pool capacity exceeded" },
	{ GPUCMD_ESTRIDES, "GPUCMD_ESTRIDES", "unsupported strides" },
	{ GPUCMD_EPOOLSINUSE, "GPUCMD_EPOOLSINUSE", "pools in use" },
	{ GPUCMD_ELAUNCH, "GPUCMD_ELAUNCH", "launch refused" },
	{ GPUCMD_ESTREAM, "GPUCMD_ESTREAM", "stream fault" },
	{ GPUCMD_ENOKERNEL, "GPUCMD_ENOKERNEL", "kernel or module not found" },
	{ GPUCMD_EINVAL, "GPUCMD_EINVAL", "invalid argument" },
	{ GPUCMD_EQUOTA, "GPUCMD_EQUOTA", "quota exceeded" },
	{ GPUCMD_EPERM, "GPUCMD_EPERM", "permission denied" },
	{ GPUCMD_EPROTO, "GPUCMD_EPROTO", "protocol error" },
	{ GPUCMD_EUNSUPPORTED, "GPUCMD_EUNSUPPORTED",
	  "unsupported by backend" },
	{ GPUCMD_EDISCONNECTED, "GPUCMD_EDISCONNECTED", "disconnected" },
	{ GPUCMD_ELIMIT, "GPUCMD_ELIMIT", "limit reached" },
	{ GPUCMD_EVERSION, "GPUCMD_EVERSION", "protocol version mismatch" },
	{ GPUCMD_ESHUTDOWN, "GPUCMD_ESHUTDOWN", "daemon shutting down" },
	{ GPUCMD_EDRIVER, "GPUCMD_EDRIVER", "driver error" },
	{ GPUCMD_EEXIST, "GPUCMD_EEXIST", "already exists" },
	{ GPUCMD_EBUSY, "GPUCMD_EBUSY", "busy" },
};

static const struct error_name *find(int code)
{
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].code == code)
			return &errors[i];
	return NULL;
}

/*
 * strerrordesc_np, not strerror: its text is static, and one that names no
 * error is NULL, where strerror writes "Unknown error N" into a buffer the
 * next call overwrites.  A caller may keep what this returns.
 */
GPUCMD_EXTERN const char *gpucmd_strerror(int code)
{
	const struct error_name *e = find(code);

	if (e != NULL)
		return e->text;
	if (code < 0 && code > -4096) {
		const char *d = strerrordesc_np(-code);
		return d != NULL ? d : "unknown error";
	}
	return "unknown error";
}

GPUCMD_EXTERN const char *gpucmd_errname(int code)
{
	const struct error_name *e = find(code);

	if (e != NULL)
		return e->name;
	if (code < 0 && code > -4096) {
		const char *n = strerrorname_np(-code);
		return n != NULL ? n : "EUNKNOWN";
	}
	return "EUNKNOWN";
}
