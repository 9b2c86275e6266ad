/*
 * builtin.c - the table of built-in kernels and their buffer extents.
 */
#include "builtin.h"

#include <stdio.h>
#include <string.h>

#include "gpucmd.h"

static const struct builtin_kernel builtins[] = {
	{ "fill_u32", "Buu", "fill_u32(buf, value:u32, count:u32)", 0, 0,
	  false },
	{ "copy", "BbU", "copy(dst, src, bytes:u64)", 0, 0, false },
	{ "add_f32", "Bbbu", "add_f32(out, a, b, n:u32)", 0, 0, false },
	{ "scale_f32", "Bfu", "scale_f32(buf, factor:f32, n:u32)", 0, 0,
	  false },
	{ "saxpy_f32", "Bbfu", "saxpy_f32(y, x, a:f32, n:u32)", 0, 0, false },
	{ "reduce_sum_f32", "Bbu", "reduce_sum_f32(out, in, n:u32)", 0, 0,
	  false },
	{ "spin", "u", "spin(usec:u32)", BUILTIN_SPIN_MAX_USEC,
	  BUILTIN_SPIN_TENANT_MAX_USEC, false },
	{ "fault", "", "fault()", 0, 0, true },
	{ NULL, NULL, NULL, 0, 0, false },
};

const struct builtin_kernel *builtin_find(const char *name)
{
	for (const struct builtin_kernel *k = builtins; k->name; k++)
		if (strcmp(k->name, name) == 0)
			return k;
	return NULL;
}

const struct builtin_kernel *builtin_all(size_t *n)
{
	*n = sizeof(builtins) / sizeof(builtins[0]) - 1;
	return builtins;
}

uint64_t builtin_extent(const struct builtin_kernel *k,
			const union builtin_value *args, size_t arg)
{
	char c = k->signature[arg];

	if (c != BUILTIN_ARG_BUF_OUT && c != BUILTIN_ARG_BUF_IN)
		return 0;
	if (strcmp(k->name, "copy") == 0)
		return args[2].u64;
	if (strcmp(k->name, "reduce_sum_f32") == 0 && arg == 0)
		return 4;
	/* Every other built-in takes its element count as its last argument. */
	return (uint64_t)args[strlen(k->signature) - 1].u32 * 4;
}

int builtin_check(const struct builtin_kernel *k,
		  const union builtin_value *args, char *msg, size_t msg_len)
{
	/* Per launch: a field, not a name to compare. */
	if (k->max_arg0 != 0 && args[0].u32 > k->max_arg0) {
		snprintf(msg, msg_len,
			 "%s of %u us is over the limit of %u us: split it "
			 "into several launches",
			 k->name, args[0].u32, k->max_arg0);
		return GPUCMD_EINVAL;
	}
	return 0;
}

size_t builtin_arg_size(char c)
{
	switch (c) {
	case BUILTIN_ARG_BUF_OUT:
	case BUILTIN_ARG_BUF_IN:
	case BUILTIN_ARG_U64:
		return 8;
	default:
		return 4;
	}
}
