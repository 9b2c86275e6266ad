/*
 * check_command.c - unit tests of command_reserve_cpu's heap fallback
 * (daemon/command.c) over a fake backend: where a copy to pageable memory
 * would block the device thread (CUDA), the heap bytes are whole pages
 * pinned with host_register and unpinned when freed; where it would not
 * (the host backend), nothing is registered; a refused registration falls
 * back to plain heap.  No GPU needed.
 */
#include <check.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "command.h"
#include "driver/driver.h"
#include "gpucmd.h"
#include "unit.h"

static unsigned registers, unregisters;
static void *registered_ptr, *unregistered_ptr;
static size_t registered_len;
static int register_rc;

static int fake_register(struct driver *d, void *ptr, size_t size)
{
	(void)d;
	registers++;
	registered_ptr = ptr;
	registered_len = size;
	return register_rc;
}

static void fake_unregister(struct driver *d, void *ptr)
{
	(void)d;
	unregisters++;
	unregistered_ptr = ptr;
}

static const struct driver_ops fake_ops = {
	.host_register = fake_register,
	.host_unregister = fake_unregister,
};

static struct driver fake = { .ops = &fake_ops };
static struct command_ctx ctx = { .driver = &fake, .pinned = NULL };
static struct command cmd = { .ctx = &ctx };

static void setup(void)
{
	registers = unregisters = 0;
	registered_ptr = unregistered_ptr = NULL;
	registered_len = 0;
	register_rc = 0;
}

START_TEST(blocking_backend_gets_registered_pages)
{
	struct host_bytes b;
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	fake.props.pageable_copies_block = true;
	command_reserve_cpu(&cmd, 10000, NULL, &b);
	ck_assert_ptr_nonnull(b.data);
	ck_assert_uint_eq(b.len, 10000);
	ck_assert(b.registered);
	ck_assert(b.pinned);
	ck_assert_uint_eq(registers, 1);
	ck_assert_ptr_eq(registered_ptr, b.data);
	/* Whole pages of its own: a shared page could not be registered. */
	ck_assert_uint_eq((uintptr_t)b.data % (uintptr_t)page, 0);
	ck_assert_uint_eq(registered_len, (10000 + page - 1) / page * page);
	memset(b.data, 0xab, b.len);
	command_free_cpu(&ctx, &b);
	ck_assert_uint_eq(unregisters, 1);
	ck_assert_ptr_eq(unregistered_ptr, registered_ptr);
	ck_assert_ptr_null(b.data);
	ck_assert(!b.registered);
}
END_TEST

START_TEST(refused_registration_falls_back_to_the_heap)
{
	struct host_bytes b;

	fake.props.pageable_copies_block = true;
	register_rc = GPUCMD_EDRIVER;
	command_reserve_cpu(&cmd, 100, NULL, &b);
	ck_assert_ptr_nonnull(b.data);
	ck_assert_uint_eq(b.len, 100);
	ck_assert(!b.registered);
	ck_assert(!b.pinned);
	ck_assert_uint_eq(registers, 1);
	command_free_cpu(&ctx, &b);
	ck_assert_uint_eq(unregisters, 0);
}
END_TEST

START_TEST(non_blocking_backend_registers_nothing)
{
	struct host_bytes b;

	fake.props.pageable_copies_block = false;
	command_reserve_cpu(&cmd, 5000, NULL, &b);
	ck_assert_ptr_nonnull(b.data);
	ck_assert_uint_eq(b.len, 5000);
	ck_assert(!b.registered);
	ck_assert(!b.pinned);
	command_free_cpu(&ctx, &b);
	ck_assert_uint_eq(registers, 0);
	ck_assert_uint_eq(unregisters, 0);
}
END_TEST

/* The reserve_cpu op's bytes, given back at once, are never pinned. */
START_TEST(unpinned_reservation_registers_nothing)
{
	struct host_bytes b;

	fake.props.pageable_copies_block = true;
	command_reserve_cpu_unpinned(&cmd, 1 << 20, &b);
	ck_assert_ptr_nonnull(b.data);
	ck_assert_uint_eq(b.len, 1 << 20);
	ck_assert(!b.registered);
	ck_assert(!b.pinned);
	command_free_cpu(&ctx, &b);
	ck_assert_uint_eq(registers, 0);
	ck_assert_uint_eq(unregisters, 0);
}
END_TEST

static Suite *command_suite(void)
{
	Suite *s = suite_create("command");
	TCase *tc = tcase_create("reserve_cpu");

	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, blocking_backend_gets_registered_pages);
	tcase_add_test(tc, refused_registration_falls_back_to_the_heap);
	tcase_add_test(tc, non_blocking_backend_registers_nothing);
	tcase_add_test(tc, unpinned_reservation_registers_nothing);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_main(command_suite());
}
