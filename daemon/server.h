/*
 * server.h - the loop thread: the listening socket, accepting clients, the
 * queue of replies from the device thread, and signals.
 *
 * The server owns every session and the executor.  The executor's
 * callbacks (device thread) push onto a mutex-guarded outbox and wake the
 * loop with a uv_async_t; the loop drains it and writes the replies.
 *
 * Reload (SIGHUP) re-reads the config file.
 *
 * Shutdown (SIGTERM, SIGINT): stop accepting, close every session (each
 * waits for its batches to complete and its memory to be freed), then stop
 * the executor and leave the loop; the exit status is 0.  The wait has a
 * deadline, [daemon] stop_timeout: when it passes, or at a second signal,
 * the daemon logs which connections still had work in flight and exits 1
 * at once (_exit: the device thread may be inside a kernel that cannot be
 * stopped, so nothing waits for it).
 */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "executor.h"

struct session;
struct outbox_msg;

struct server {
	uv_loop_t *loop;
	uv_pipe_t listener;
	uv_async_t wakeup;
	uv_idle_t spin;	     /* polls the outbox a while (spin.h) */
	uint64_t spin_until; /* spin_now_ns() the polling stops at */
	unsigned spin_turns; /* polls so far: every fourth yields */
	unsigned spin_us;    /* [daemon] spin_us, fixed at start */
	/*
	 * The connection read last, and whether it has been the only one
	 * sending: then the spin reads its socket itself (on_spin).  reads
	 * counts the reads since the spin last looked.
	 */
	struct session *hot;
	unsigned reads;
	bool hot_alone;
	/*
	 * Connections whose next frame is a large batch, waiting for the loop
	 * to decode it (server_turn_wait), oldest first; the idle handle runs
	 * while any wait, so the poll between turns does not block.
	 */
	uv_idle_t turns;
	struct session *turn_head;
	struct session *turn_tail;
	/*
	 * Read staging held by replies in pieces that wait in libuv's write
	 * queues (clients reading slowly), and the most it may be: half the
	 * pinned pool, fixed at start.  Past it, a waiting reply's bytes are
	 * copied out and its staging freed (session.c), so clients that do
	 * not read cannot take the pool from the others.
	 */
	uint64_t pieces_queued;
	uint64_t pieces_cap;
	uv_signal_t sigint;
	uv_signal_t sigterm;
	uv_signal_t sighup;
	uv_timer_t watchdog;	  /* WATCHDOG=1 and STATUS= refresh */
	uv_timer_t stop_deadline; /* [daemon] stop_timeout, once stopping */
	bool activated;		  /* the socket came from systemd */
	struct config cfg;
	int64_t admin_gid; /* -1: no admin group */
	struct executor *ex;

	pthread_mutex_t lock; /* guards the outbox */
	struct outbox_msg *out_head;
	struct outbox_msg **out_tail;
	atomic_uint out_ready; /* the outbox has messages */

	struct session *sessions;
	uint32_t nsessions;
	uint64_t next_id;
	bool listening;
	/*
	 * The socket file we bound (not an activated one): the stop removes
	 * the path only while it is still this file; the tick binds the path
	 * again when nothing is there, and warns once when another's file is
	 * (socket_gone).
	 */
	uint64_t sock_dev, sock_ino;
	/*
	 * What the tick said last of the path, so that each is said once:
	 * nothing (it is ours), that binding it again failed, or that it is
	 * another's file now.
	 */
	enum { SOCK_OURS, SOCK_UNBOUND, SOCK_ANOTHERS } sock_state;
	/*
	 * A second descriptor of the listening socket (-1: none), so that
	 * accepting can pause: an accept that fails for descriptors where
	 * libuv's own way out does not help calls on_connection again at
	 * once, for ever.  The listener is closed instead, and made again
	 * from this one SERVER_ACCEPT_PAUSE_MS later (accept_resume).
	 */
	int listen_spare;
	uv_timer_t accept_resume;
	bool accept_paused;
	uv_work_t pool_start; /* starts libuv's pool (start_pool) */
	bool stopping;
	uint32_t stop_ticks;	/* ticks since server_stop (drain progress) */
	uint64_t stop_began_ms; /* uv_now at server_stop */
	int exit_code;		/* server_run's result */
	/*
	 * Rebuild the settings for a reload: defaults, the file, then the
	 * command line again (flags win over the file, also after SIGHUP).
	 */
	int (*rebuild)(struct config *cfg, char *err, size_t err_len);
	char fatal[256]; /* set by the device thread, under lock */
	/*
	 * What each connection is told as the daemon stops (an Error frame
	 * of GPUCMD_EDISCONNECTED before its socket closes): why, and what
	 * to do.  Set by server_stop (loop thread).
	 */
	char stop_reason[512];
};

/**
 * Keep the loop awake for spin_us (spin.h), polling the device thread's
 * replies instead of sleeping until its wake-up: called when a batch went
 * to the device thread and when replies came back.  awaiting: the reply
 * waits for device work (a sync or a read), so watch as long as the device
 * thread and libgpucmd do for it (spin_budget).
 */
void server_spin(struct server *srv, bool awaiting);
/** Bytes came from s: the spin may read s directly next (on_spin). */
void server_note_read(struct server *srv, struct session *s);

/**
 * s has a large frame read and waits to decode it: the loop gives it a
 * turn (session_take_turn) after the frames already waiting, and polls
 * the sockets between turns, so small frames that come meanwhile (pings,
 * a sync, a batch of a few ops) are answered first.
 */
void server_turn_wait(struct server *srv, struct session *s);
/** s no longer waits for a turn (it closes). */
void server_turn_forget(struct server *srv, struct session *s);

/**
 * Set aside the outbox messages a batch of s may send (before it is
 * submitted): 0 or GPUCMD_ENOMEM.
 */
int server_reserve_replies(struct server *srv, struct session *s);

/**
 * Start the executor (opening the device) and listen on cfg's socket.
 * 0, or an error with a sentence in why.
 */
int server_init(struct server *srv, uv_loop_t *loop, const struct config *cfg,
		char *why, size_t why_len);
/** Run the loop until shutdown; 0 on a clean stop. */
int server_run(struct server *srv);
/**
 * Re-read the config file (SIGHUP): new limits apply to new connections,
 * service limits at once; connections stay.  0 or an error (logged, and
 * the old settings stay).
 */
int server_reload(struct server *srv);
/** Begin a graceful shutdown (loop thread). */
void server_stop(struct server *srv);
/** A session is fully closed: forget it (loop thread). */
void server_session_gone(struct server *srv, struct session *s);
