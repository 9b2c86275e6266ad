/*
 * frame.c - packing and checking the frame header, encoding and decoding
 * Frame messages.  See frame.h for the layout.
 */
#include "frame.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpucmd.h"

static void put_le16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static uint16_t get_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
	       ((uint32_t)p[3] << 24);
}

void frame_header_pack(const struct frame_header *hdr, uint8_t *buf)
{
	put_le32(buf, hdr->magic);
	put_le16(buf + 4, hdr->version);
	put_le16(buf + 6, hdr->flags);
	put_le32(buf + 8, hdr->length);
}

void frame_header_unpack(const uint8_t *buf, struct frame_header *hdr)
{
	hdr->magic = get_le32(buf);
	hdr->version = get_le16(buf + 4);
	hdr->flags = get_le16(buf + 6);
	hdr->length = get_le32(buf + 8);
}

int frame_header_check(const struct frame_header *hdr, uint32_t max_body,
		       char *msg, size_t msg_len)
{
	char dummy[1];

	if (msg == NULL) {
		msg = dummy;
		msg_len = sizeof(dummy);
	}
	if (hdr->magic != FRAME_MAGIC) {
		snprintf(msg, msg_len,
			 "bad frame magic 0x%08x (expected 0x%08x \"GCMD\"): "
			 "the peer does not speak the gpucmd protocol",
			 hdr->magic, FRAME_MAGIC);
		return GPUCMD_EPROTO;
	}
	if (hdr->version != GPUCMD_PROTOCOL_VERSION) {
		snprintf(msg, msg_len,
			 "protocol version %u is not supported (this side "
			 "speaks %u): upgrade the older of client and daemon",
			 hdr->version, GPUCMD_PROTOCOL_VERSION);
		return GPUCMD_EVERSION;
	}
	if (hdr->flags != 0) {
		snprintf(msg, msg_len, "unknown frame flags 0x%04x",
			 hdr->flags);
		return GPUCMD_EPROTO;
	}
	if (max_body > FRAME_MAX_BODY)
		max_body = FRAME_MAX_BODY;
	if (hdr->length > max_body) {
		snprintf(msg, msg_len,
			 "frame body of %u bytes is over the limit of %u bytes "
			 "(max_frame_bytes): split the batch or move bulk data "
			 "through a shared region",
			 hdr->length, max_body);
		return GPUCMD_ELIMIT;
	}
	return 0;
}

int frame_encode(const Gpucmd__Frame *f, uint8_t **out, size_t *len)
{
	size_t body = gpucmd__frame__get_packed_size(f);
	uint8_t *buf;
	struct frame_header hdr;

	if (body > FRAME_MAX_BODY)
		return GPUCMD_ELIMIT;
	buf = malloc(FRAME_HEADER_SIZE + body);
	if (buf == NULL)
		return -ENOMEM;
	hdr.magic = FRAME_MAGIC;
	hdr.version = GPUCMD_PROTOCOL_VERSION;
	hdr.flags = 0;
	hdr.length = (uint32_t)body;
	frame_header_pack(&hdr, buf);
	gpucmd__frame__pack(f, buf + FRAME_HEADER_SIZE);
	*out = buf;
	*len = FRAME_HEADER_SIZE + body;
	return 0;
}

Gpucmd__Frame *frame_decode(const uint8_t *body, size_t len)
{
	return gpucmd__frame__unpack(NULL, len, body);
}

void frame_free(Gpucmd__Frame *f)
{
	if (f != NULL)
		gpucmd__frame__free_unpacked(f, NULL);
}
