/*
 * frame.h - the fixed header in front of every message on the socket, and
 * the helpers that pack and unpack a whole frame.  Shared by the daemon and
 * the client library; pure functions, safe from any thread.
 *
 *   offset 0  u32  magic   "GCMD" (0x444d4347 little-endian)
 *   offset 4  u16  version GPUCMD_PROTOCOL_VERSION
 *   offset 6  u16  flags   0 (reserved; a frame with unknown flags is refused)
 *   offset 8  u32  length  of the protobuf body that follows
 *
 * All fields are little-endian.  A reader checks magic, version and length
 * against its configured maximum before it allocates anything for the body.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpucmd.pb-c.h"

/*
 * Protocol version.  Bump it for any change an older peer would misread;
 * adding a new optional field or a new op does not need a bump (old daemons
 * answer an unknown op with GPUCMD_EPROTO).
 *   1 - first version (Hello/Welcome, Request/Response, inline data).
 */
#define GPUCMD_PROTOCOL_VERSION 1

#define FRAME_MAGIC 0x444d4347u /* "GCMD" */
#define FRAME_HEADER_SIZE 12
/* Hard ceiling on a body whatever the configuration says. */
#define FRAME_MAX_BODY (1u << 30)
/* Default body limit (gpucmdd.conf max_frame_bytes). */
#define FRAME_DEFAULT_MAX_BODY (64u << 20)

struct frame_header {
	uint32_t magic;
	uint16_t version;
	uint16_t flags;
	uint32_t length;
};

/** Write hdr into buf (FRAME_HEADER_SIZE bytes). */
void frame_header_pack(const struct frame_header *hdr, uint8_t *buf);
/** Read a header from buf; no validation. */
void frame_header_unpack(const uint8_t *buf, struct frame_header *hdr);
/**
 * Validate a header against max_body: 0, or GPUCMD_EPROTO (bad magic or
 * flags), GPUCMD_EVERSION, GPUCMD_ELIMIT (length over max_body).  When msg is
 * not NULL a sentence with the numbers is written there.
 */
int frame_header_check(const struct frame_header *hdr, uint32_t max_body,
		       char *msg, size_t msg_len);

/**
 * Encode f as a whole frame (header + body) into a malloc'ed buffer stored in
 * *out with its size in *len.  0 or a negative code.
 */
int frame_encode(const Gpucmd__Frame *f, uint8_t **out, size_t *len);
/*
 * A frame encoded as pieces, for writev: the header and the small parts of
 * the message are copied into scratch, byte fields of FRAME_PIECE_REF_MIN
 * bytes or more are referenced where they are (the caller's buffers must
 * outlive the write).  Reusable: frame_pieces_encode starts it over and
 * keeps its memory.
 */
#define FRAME_PIECE_REF_MIN 4096
/* A body up to this size is packed flat into scratch, in one piece. */
#define FRAME_PIECES_FLAT_MAX (256u << 10)

struct frame_piece {
	const uint8_t *ext; /* referenced bytes, or NULL: scratch + off */
	size_t off;
	size_t len;
};

struct frame_pieces {
	uint8_t *scratch;
	size_t used;
	size_t cap;
	struct frame_piece *v;
	size_t n;
	size_t vcap;
	size_t total; /* header + body */
	int err;
	size_t *sizes; /* the hand encoder's op sizes, kept */
	size_t sizes_cap;
	/*
	 * When set, a large byte field is referenced only where may_ref
	 * answers true (bytes known to outlive the write), else copied.
	 */
	bool (*may_ref)(const uint8_t *data, size_t len, void *arg);
	void *may_ref_arg;
};

/** Encode f into p (header included).  0 or a negative code. */
int frame_pieces_encode(struct frame_pieces *p, const Gpucmd__Frame *f);
/** Where piece i starts. */
const uint8_t *frame_piece_data(const struct frame_pieces *p, size_t i);
/**
 * p's pieces joined into one frame_buf_alloc buffer of p->total bytes;
 * NULL without memory, or when the pieces do not add up to p->total.
 */
uint8_t *frame_pieces_join(const struct frame_pieces *p);
/** Free p's memory (it may be encoded into again). */
void frame_pieces_free(struct frame_pieces *p);

/**
 * Decode a body of len bytes into a Frame; NULL when it is not valid
 * protobuf.  Free with frame_free.
 */
Gpucmd__Frame *frame_decode(const uint8_t *body, size_t len);
/*
 * frame_decode reads Request frames with a hand-written fast path that
 * builds what protobuf-c would, or leaves the frame to protobuf-c (see
 * frame.c).  The fast path alone, for the tests that compare the two: NULL
 * when it declines.  Free with frame_free.
 */
Gpucmd__Frame *frame_decode_fast(const uint8_t *body, size_t len);
/*
 * Without decoding anything: a Request frame's id, its ops, the most
 * arguments any of its kernel ops has, and its region_attach ops (which
 * took descriptors).  False when body is not a Request this scan can read
 * (decode it to find out).  Decoding turns each small op into tens of
 * times its bytes in structs, so a large frame is counted first and
 * refused over the limits instead (session.c).
 */
struct frame_request_counts {
	uint64_t id;	 /* of the request decoding would keep */
	size_t nops;	 /* decoding would make, every request's */
	size_t max_args; /* of any kernel message decoding meets */
	size_t attaches; /* region_attach ops of the request kept */
};
bool frame_request_counts(const uint8_t *body, size_t len,
			  struct frame_request_counts *out);
/*
 * About the most memory protobuf-c's decoding of a Frame body of len bytes
 * would take, walking it by the schema without decoding: every message's
 * struct, every repeated element, every bytes field, every field it does
 * not know (kept, with a copy of its bytes), and the record it keeps of
 * each field of the message it decodes.  The walk stops once past limit
 * (the result is then over limit, not exact), or where the bytes stop
 * being wire format (decoding refuses them there, having kept what came
 * before).  The fields it met, in *fields.
 */
uint64_t frame_decoded_bound(const uint8_t *body, size_t len, uint64_t limit,
			     uint64_t *fields);
/*
 * Whether req's reply waits for device work: a sync, or a read whose bytes
 * must have landed.  libgpucmd and the daemon's loop watch that long for
 * it (spin_budget, SPIN_AWAIT_US), instead of the short spin.
 */
bool frame_request_awaits_device(const Gpucmd__Request *req);
/*
 * Like frame_decode, taking over body (from frame_buf_alloc): bytes of the
 * ops the fast path reads point into it, and frame_free (or this call, on
 * failure or when the frame did not need it) gives it back.
 */
Gpucmd__Frame *frame_decode_owned(uint8_t *body, size_t len);

/*
 * Buffers for whole frames (bodies read in one piece, encoded replies, a
 * client's large ops): large ones are kept for the next frames instead of
 * being faulted in afresh.  frame_buf_trim, called now and then (the
 * daemon's tick, libgpucmd after its frames), gives back the kept ones
 * when none was taken or given back in the last idle_ns (0: now).
 */
uint8_t *frame_buf_alloc(size_t len);
void frame_buf_free(uint8_t *buf);
void frame_buf_trim(uint64_t idle_ns);
/** How many spare buffers the pool keeps now (for tests). */
size_t frame_buf_spares(void);
/**
 * How many spent decoding arenas are kept for the next frames now (for
 * tests); frame_buf_trim gives them back with the buffers (a trim of
 * idle_ns > 0 looks only when a large one, of 64 KiB or more, is
 * kept; a trim of 0 gives back every one).
 */
size_t frame_arena_spares(void);
/** Like frame_encode, into a frame_buf_alloc buffer. */
int frame_encode_buf(const Gpucmd__Frame *f, uint8_t **out, size_t *len);

/** Free a decoded frame. */
void frame_free(Gpucmd__Frame *f);
/*
 * Bytes of host memory a decoded frame holds besides its body: what its
 * structs (and, decoded by protobuf-c, copies of its bytes fields) took of
 * the arena they were built in, which can be tens of times the body (many
 * small nested messages).  0 for a frame protobuf-c built with malloc.
 */
size_t frame_held_bytes(const Gpucmd__Frame *f);
