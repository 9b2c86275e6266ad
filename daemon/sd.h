/*
 * sd.h - everything gpucmdd asks of systemd, in one place (daemon/sd.c is
 * the only file that calls libsystemd).
 *
 *   - socket activation: exactly one inherited Unix stream socket is used
 *     as the listener; more than one is an error; none means the daemon
 *     binds its own;
 *   - readiness and state: READY=1 right before the loop runs, STATUS=
 *     lines while the device opens and with a live summary, RELOADING=1
 *     while a SIGHUP re-reads the file (READY=1 again when it is done, even
 *     when the file was refused: the daemon serves on either way),
 *     STOPPING=1 on shutdown;
 *   - the watchdog: when WatchdogSec= is set, a loop timer sends WATCHDOG=1
 *     at half the interval, so a wedged loop stops the pings;
 *   - the journal: when stderr is connected to the journal, log lines carry
 *     "<N>" priority prefixes (log_set_journal).
 *
 * Outside systemd every function is a harmless no-op.  Thread: the loop
 * thread (and main before it starts).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/**
 * The listening socket systemd passed, if any: 0 with *fd set (-1 when
 * none was passed), or GPUCMD_EINVAL with a sentence in why when the
 * passed descriptors are not exactly one Unix stream socket.
 */
int sd_listen_fd(int *fd, char *why, size_t why_len);
/** True when stderr goes to the journal (JOURNAL_STREAM matches). */
bool sd_stderr_is_journal(void);
/** READY=1 with a STATUS= line. */
void sd_ready(const char *status);
/** STATUS=... (printf-style). */
void sd_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/** RELOADING=1 with MONOTONIC_USEC= (sd_notify(3)) and a STATUS= line. */
void sd_reloading(void);
/** STOPPING=1. */
void sd_stopping(void);
/** The watchdog interval in microseconds, 0 when not enabled. */
uint64_t sd_watchdog_usec(void);
/** WATCHDOG=1. */
void sd_watchdog_ping(void);
