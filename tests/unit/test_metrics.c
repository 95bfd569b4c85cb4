#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "metrics.h"

static double read_int(void *arg) { return *(int *)arg; }

static bool rendered(const char *line)
{
	growbuf b = {0};
	metrics_render(&b);
	bool found = strstr(b.data, line) != NULL;
	growbuf_free(&b);
	return found;
}

/* A reading shows 0 until its owner binds it, its owner's value while
 * bound, and 0 again once unbound; help and type come once per family. */
static void test_reading_follows_its_binding(void **state)
{
	int queued = 7, other = 3;
	metrics_reading *a = metrics_reading_add(
		"test_queued", "gauge", "Things queued.", "kind=\"a\"",
		read_int);
	metrics_reading *b = metrics_reading_add(
		"test_queued", "gauge", "Things queued.", "kind=\"b\"",
		read_int);
	assert_non_null(a);
	assert_non_null(b);
	double v = -1;
	assert_false(metrics_read("test_queued", &v));
	assert_true(rendered("test_queued{kind=\"a\"} 0\n"));

	metrics_reading_bind(a, &queued);
	metrics_reading_bind(b, &other);
	assert_true(metrics_read("test_queued", &v));
	assert_true(v == 7.0);
	assert_true(rendered("# HELP test_queued Things queued.\n"
			     "# TYPE test_queued gauge\n"
			     "test_queued{kind=\"a\"} 7\n"
			     "test_queued{kind=\"b\"} 3\n"));

	metrics_reading_unbind(a);
	assert_false(metrics_read("test_queued", &v));
	assert_true(rendered("test_queued{kind=\"a\"} 0\n"));
	assert_true(rendered("test_queued{kind=\"b\"} 3\n"));
	metrics_reading_unbind(b); /* other goes with this frame */
}

/* Seal counts are copied: the caller's ids may go once the call returns. */
static void test_seal_counts_are_copied(void **state)
{
	char id[] = "k1";
	metrics_key_count e[] = {{id, 42}};
	metrics_set_seal_counts(e, 1, 42, 1000);
	id[1] = '9';
	assert_true(rendered("idemproxy_seal_key_seals{key=\"k1\"} 42\n"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reading_follows_its_binding),
		cmocka_unit_test(test_seal_counts_are_copied),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
