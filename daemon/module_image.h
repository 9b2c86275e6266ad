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
 * Threads: any (pure functions of the bytes).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* What module_image_static_bytes could tell. */
enum module_image_known {
	MODULE_IMAGE_KNOWN = 0,		/* the size is the image's */
	MODULE_IMAGE_UNKNOWN = 1,	/* compressed or unreadable: a lower bound */
};

/**
 * Bytes of device memory the global variables of image (len bytes, any
 * format: recognised by its first bytes, a fatbin or ELF magic, else PTX
 * text) take once loaded.  *known (may be NULL) says whether every part
 * of the image could be read.
 */
uint64_t module_image_static_bytes(const void *image, size_t len,
				   enum module_image_known *known);
