/*
 * batch.h - what the rest of the library needs from the batch builder
 * beyond the public gpucmd_batch_* calls: ops that have no public builder
 * because a library call wraps them in a round trip of its own.
 *
 * A batch is the protobuf Request being built; it belongs to the thread of
 * its connection and is consumed by gpucmd_submit.
 */
#pragma once

#include "gpucmd.h"
#include "gpucmd.pb-c.h"

/**
 * Queue an op that carries no fields (sync, memory_usage, ping,
 * memory_report, status); GPUCMD_EINVAL for any other kind.
 */
int batch_add_plain(struct gpucmd_batch *b, Gpucmd__Op__OpCase kind);
