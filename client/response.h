/*
 * response.h - turning a Response frame into the opaque gpucmd_response
 * that the public accessors read.  The response owns the decoded frame and
 * frees it with itself; it belongs to whoever collected it.
 */
#pragma once

#include "gpucmd.h"
#include "gpucmd.pb-c.h"

/**
 * Wrap frame (a Response frame; ownership moves to the response on
 * success, stays with the caller on failure).
 */
int response_new(Gpucmd__Frame *frame, struct gpucmd_response **out);
