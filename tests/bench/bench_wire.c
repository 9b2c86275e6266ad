/*
 * bench_wire.c - the size on the socket of the gpucmd frames a scenario
 * sends and gets back, so that its raw-socket floor moves exactly as many
 * bytes.  The messages are built the way client/batch.c builds them (a
 * kernel op carries three grid and three block values) and the way
 * daemon/dispatch.c answers (one "done" result per op), then measured with
 * protobuf-c; nothing here is sent.
 */
#include "bench.h"

#include <stdlib.h>

#include "frame.h"

/* A request id of the size a long run reaches (two varint bytes). */
#define BENCH_WIRE_ID 1000

static size_t frame_size(const Gpucmd__Frame *f)
{
	return FRAME_HEADER_SIZE + gpucmd__frame__get_packed_size(f);
}

size_t bench_wire_request(enum bench_op op, size_t nops)
{
	static const uint32_t one[3] = { 1, 1, 1 };
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	Gpucmd__Op o = GPUCMD__OP__INIT;
	Gpucmd__OpPing ping = GPUCMD__OP_PING__INIT;
	Gpucmd__OpSync sync = GPUCMD__OP_SYNC__INIT;
	Gpucmd__OpKernel k = GPUCMD__OP_KERNEL__INIT;
	Gpucmd__KernelArg arg = GPUCMD__KERNEL_ARG__INIT;
	Gpucmd__KernelArg *args[1] = { &arg };
	Gpucmd__Op **ops;
	size_t size;

	switch (op) {
	case BENCH_OP_PING:
		o.op_case = GPUCMD__OP__OP_PING;
		o.ping = &ping;
		break;
	case BENCH_OP_SYNC:
		o.op_case = GPUCMD__OP__OP_SYNC;
		o.sync = &sync;
		break;
	case BENCH_OP_SPIN0:
		arg.value_case = GPUCMD__KERNEL_ARG__VALUE_U32;
		arg.u32 = 0;
		k.name = "spin";
		k.n_grid = 3;
		k.grid = (uint32_t *)one;
		k.n_block = 3;
		k.block = (uint32_t *)one;
		k.n_args = 1;
		k.args = args;
		o.op_case = GPUCMD__OP__OP_KERNEL;
		o.kernel = &k;
		break;
	}
	ops = malloc((nops ? nops : 1) * sizeof(*ops));
	if (ops == NULL)
		return 0;
	for (size_t i = 0; i < nops; i++)
		ops[i] = &o;
	req.id = BENCH_WIRE_ID;
	req.stream = 0;
	req.n_ops = nops;
	req.ops = ops;
	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = &req;
	size = frame_size(&f);
	free(ops);
	return size;
}

size_t bench_wire_response(size_t nresults)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Response resp = GPUCMD__RESPONSE__INIT;
	Gpucmd__OpResult r = GPUCMD__OP_RESULT__INIT;
	Gpucmd__OpResult **results;
	size_t size;

	r.result_case = GPUCMD__OP_RESULT__RESULT_DONE;
	r.done = 1;
	results = malloc((nresults ? nresults : 1) * sizeof(*results));
	if (results == NULL)
		return 0;
	for (size_t i = 0; i < nresults; i++)
		results[i] = &r;
	resp.id = BENCH_WIRE_ID;
	resp.n_results = nresults;
	resp.results = results;
	f.msg_case = GPUCMD__FRAME__MSG_RESPONSE;
	f.response = &resp;
	size = frame_size(&f);
	free(results);
	return size;
}
