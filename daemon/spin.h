/*
 * spin.h - a short, bounded busy wait before a thread blocks.
 *
 * The daemon hands work between threads: loop -> device thread -> backend
 * stream -> device thread -> loop.  Waking a thread that sleeps on another
 * CPU costs a scheduler round and, on a virtual machine, an interrupt into
 * a halted virtual CPU: 30-40 us each on the 2-core Firecracker VM the
 * project is developed on (tests/bench measures it), against under 1 us
 * for a thread that is still running.  So a thread that just did work
 * watches its flag for a while (the [daemon] key spin_us, default
 * SPIN_DEFAULT_US) before it goes to sleep: a client that sends its next
 * batch, or a stream that completes, within that time finds it awake.  The
 * waiting thread yields the CPU between looks, so runnable work on the same
 * CPU goes first; an idle daemon spins at most spin_us after its last work,
 * then sleeps and costs nothing.  spin_us = 0 turns it off.
 *
 * Header only, and shared: libgpucmd watches its socket the same way
 * (spin_recv, $GPUCMD_SPIN_US), and so does the bench's echo floor.
 */
#pragma once

#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>

/* The default of the [daemon] key spin_us, and its largest value. */
#define SPIN_DEFAULT_US 50
#define SPIN_MAX_US 10000
/*
 * While the daemon waits for the completion of device work it enqueued (a
 * copy of a few MiB takes hundreds of microseconds), the loop and the
 * device thread watch this long instead (when spinning is on at all, and
 * spin_us when that is longer: spin_budget): the answer comes at the end
 * of that work, not at a client's whim.
 */
#define SPIN_AWAIT_US 1000

/*
 * The loop watches for the reply to a batch it just handed over only when
 * the batch has at most this many ops: the device thread spends 0.1-0.3 us
 * on each, so the reply to a larger batch comes after the spin would have
 * ended, and watching for it only burns a CPU (a third of the daemon's CPU
 * per op in batches of 1024, tests/bench).
 */
#define SPIN_REPLY_MAX_OPS 64

/* How long to watch: spin_us when idle, longer while awaiting the device. */
static inline unsigned spin_budget(unsigned spin_us, bool awaiting)
{
	if (spin_us == 0)
		return 0;
	return awaiting && spin_us < SPIN_AWAIT_US ? SPIN_AWAIT_US : spin_us;
}

static inline uint64_t spin_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void spin_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield" ::: "memory");
#endif
}

/*
 * A yield that took this long let other work run on this CPU: the CPUs are
 * busy, and a spinning thread would only take time from that work, so it
 * goes to sleep instead (on a machine with CPUs to spare, yields return at
 * once and spinning goes on).
 */
#define SPIN_CONTENDED_NS 20000u

/* Yield; false when it showed the CPU to be contended. */
static inline bool spin_yield(uint64_t *now_ns)
{
	uint64_t before = *now_ns;

	sched_yield();
	*now_ns = spin_now_ns();
	return *now_ns - before < SPIN_CONTENDED_NS;
}

/*
 * Watch *word for up to us microseconds; true as soon as it is not zero.
 * The caller still checks its real condition under its lock: this only
 * decides whether the thread sleeps.
 */
static inline bool spin_wait(atomic_uint *word, unsigned us)
{
	uint64_t now, end;

	if (atomic_load_explicit(word, memory_order_acquire) != 0)
		return true;
	if (us == 0)
		return false;
	now = spin_now_ns();
	end = now + (uint64_t)us * 1000u;
	for (unsigned i = 1;; i++) {
		if (atomic_load_explicit(word, memory_order_acquire) != 0)
			return true;
		spin_relax();
		if ((i & 31) == 0) {
			now = spin_now_ns();
			if (now >= end || !spin_yield(&now))
				return false;
		}
	}
}

/*
 * Watch socket fd for up to us microseconds before a blocking read, with
 * the same give-way rule: an answer that comes within that time finds the
 * thread awake.  Each look is the read itself (MSG_DONTWAIT), not a peek
 * followed by a read: one system call fewer a round trip.  Returns the
 * bytes read into buf (at most len), or 0 when the watch ended with none:
 * the caller's blocking read then finds the bytes, the end of the stream
 * or the error itself.
 */
static inline ssize_t spin_recv(int fd, void *buf, size_t len, unsigned us)
{
	uint64_t now, end;

	if (us == 0 || len == 0)
		return 0;
	now = spin_now_ns();
	end = now + (uint64_t)us * 1000u;
	for (;;) {
		ssize_t n = recv(fd, buf, len, MSG_DONTWAIT);

		if (n > 0)
			return n;
		if (n == 0)
			return 0;
		if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			return -errno;
		if (!spin_yield(&now) || now >= end)
			return 0;
	}
}
