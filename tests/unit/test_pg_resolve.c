#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "pg_resolve.h"

/* The value of the last `key` in r's parameters, or NULL. */
static const char *param(const pg_resolved *r, const char *key)
{
	const char *v = NULL;
	for (int i = 0; r->keys[i]; i++)
		if (!strcmp(r->keys[i], key))
			v = r->vals[i];
	return v;
}

static int resolve(const char *conninfo, pg_resolved *r, char *err)
{
	const char *keys[] = {"connect_timeout", "application_name", "dbname",
			      NULL};
	const char *vals[] = {"5", "test", conninfo, NULL};
	return pg_resolve_params(keys, vals, r, err, 256);
}

static void test_addresses_and_sockets_need_no_lookup(void **state)
{
	(void)state;
	unsetenv("PGHOST");
	unsetenv("PGHOSTADDR");
	const char *plain[] = {"postgresql://u@127.0.0.1:5432/db",
			       "host=/tmp,::1 port=1,2 dbname=x",
			       "host=localhost hostaddr=127.0.0.1",
			       "idemproxy"};
	for (size_t i = 0; i < sizeof plain / sizeof *plain; i++) {
		pg_resolved r;
		char err[256] = "";
		assert_int_equal(resolve(plain[i], &r, err), 0);
		assert_null(param(&r, "hostaddr"));
		assert_string_equal(param(&r, "dbname"), plain[i]);
		pg_resolved_free(&r);
	}
}

static void test_a_name_is_passed_as_its_address(void **state)
{
	(void)state;
	pg_resolved r;
	char err[256] = "";
	assert_int_equal(
		resolve("postgresql://u@localhost:6543/db", &r, err), 0);
	/* the name stays for TLS and the messages; the port applies to all */
	assert_string_equal(param(&r, "host"), "localhost");
	assert_string_equal(param(&r, "hostaddr"), "127.0.0.1");
	assert_null(param(&r, "port"));
	pg_resolved_free(&r);
}

static void test_multi_host_lists_stay_aligned(void **state)
{
	(void)state;
	pg_resolved r;
	char err[256] = "";
	assert_int_equal(resolve("host=/tmp,localhost,10.0.0.9 port=1,2,3 "
				 "dbname=db",
				 &r, err),
			 0);
	assert_string_equal(param(&r, "host"), "/tmp,localhost,10.0.0.9");
	assert_string_equal(param(&r, "hostaddr"), ",127.0.0.1,");
	assert_string_equal(param(&r, "port"), "1,2,3");
	pg_resolved_free(&r);
	/* the URL form, names only */
	assert_int_equal(
		resolve("postgresql://u@localhost:1,localhost:2/db", &r, err),
		0);
	assert_string_equal(param(&r, "host"), "localhost,localhost");
	assert_string_equal(param(&r, "hostaddr"), "127.0.0.1,127.0.0.1");
	assert_string_equal(param(&r, "port"), "1,2");
	pg_resolved_free(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_addresses_and_sockets_need_no_lookup),
		cmocka_unit_test(test_a_name_is_passed_as_its_address),
		cmocka_unit_test(test_multi_host_lists_stay_aligned),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
