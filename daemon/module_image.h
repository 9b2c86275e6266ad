/*
 * module_image.h - what a device-code image holds in device memory for as
 * long as it is loaded: its global variables.
 *
 * A module's `__device__` (PTX .global) variables are allocated when it is
 * loaded and stay until it is unloaded: memory no pool sees.  The daemon
 * counts them against the quota of each service that holds the module
 * (service.h, module_bytes), so a service cannot take the device's memory
 * by loading modules with large globals.  The size comes from the image
 * itself, before anything is loaded:
 *
 *   - PTX: the module-scope .global declarations (element size x
 *     dimensions, each rounded up to its alignment; .extern ones hold
 *     nothing here);
 *   - cubin: the sizes of its .nv.global (zero-initialised) and
 *     .nv.global.init sections;
 *   - fatbin: the largest of its PTX and cubin entries (the driver loads
 *     one of them); zstd-compressed entries are expanded while the image's
 *     budget lasts (64 times its size, 64 MiB at most, module_image.c);
 *     an entry stored with the older compression, or past that budget,
 *     cannot be read, and is then not counted (MODULE_IMAGE_UNKNOWN says
 *     so).
 *
 * Code, constant banks and the driver's own bookkeeping are not counted:
 * they are small and bounded per module.  Sizes saturate at UINT64_MAX, so
 * a declaration of absurd size is refused by any quota rather than
 * wrapping.
 *
 * The same image says what parameters each of its kernels takes, which a
 * CUDA driver older than 12.4 cannot (it has no cuFuncGetParamInfo), and
 * cuLaunchKernel reads one argument per parameter the kernel declares,
 * whatever the caller passed.  module_image_params_read reads them once,
 * when the module is loaded, for the backend to check launches against
 * (driver/cuda.c):
 *
 *   - PTX: each `.entry name(.param ..., ...)` list: a parameter's size is
 *     its type's times its vector and array counts (.align, .ptr and the
 *     state space after .ptr change nothing);
 *   - cubin: the EIATTR_KPARAM_INFO (and _V2, for large parameters)
 *     records of each kernel's .nv.info.<name> section (ordinal, offset,
 *     size), taken only when they describe parameters 0..n-1 laid out one
 *     after another up to the EIATTR_CBANK_PARAM_SIZE the section states;
 *   - fatbin: every entry it can read (as above), which must agree.
 *
 * Whatever cannot be read this way leaves that kernel unknown, and its
 * launches unchecked, never refused for numbers the driver would not use:
 * a type or attribute the scanner does not know, records that do not add
 * up, parts of the image that disagree, and a cubin kernel without records
 * (it may take no parameters, or describe them some other way).  Work and
 * memory stay in proportion to the image's size, whatever its headers say.
 *
 * Threads: any (pure functions of the bytes).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What module_image_static_bytes could tell. */
enum module_image_known {
	MODULE_IMAGE_KNOWN = 0,	  /* the size is the image's */
	MODULE_IMAGE_UNKNOWN = 1, /* compressed or unreadable: a lower bound */
};

/**
 * Bytes of device memory the global variables of image (len bytes, any
 * format: recognised by its first bytes, a fatbin or ELF magic, else PTX
 * text) take once loaded.  *known (may be NULL) says whether every part
 * of the image could be read.
 */
uint64_t module_image_static_bytes(const void *image, size_t len,
				   enum module_image_known *known);

/* The parameters of an image's kernels (module_image_params_read). */
struct module_image_params;

/**
 * The parameter lists of the kernels image (len bytes, any format, as for
 * module_image_static_bytes) declares, into *out (free it with
 * module_image_params_free): 0, or -ENOMEM.  An image that declares none
 * readably gives an empty table.
 */
int module_image_params_read(const void *image, size_t len,
			     struct module_image_params **out);
/**
 * Whether t knows the parameters of kernel name: then *n is their count
 * and (*sizes)[i] the bytes of parameter i (the array belongs to t).
 */
bool module_image_params_find(const struct module_image_params *t,
			      const char *name, size_t *n,
			      const size_t **sizes);
/** Free t (NULL is fine). */
void module_image_params_free(struct module_image_params *t);
