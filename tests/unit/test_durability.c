#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "durability.h"

static void test_required(void **state)
{
	(void)state;
	assert_int_equal(durability_required(""), 0);
	assert_int_equal(durability_required("  "), 0);
	assert_int_equal(durability_required("s1"), 1);
	assert_int_equal(durability_required("s1, s2"), 1);
	assert_int_equal(durability_required("*"), 1);
	assert_int_equal(durability_required("2 (s1, s2, s3)"), 2);
	assert_int_equal(durability_required("FIRST 2 (s1, s2)"), 2);
	assert_int_equal(durability_required("first 1(s1)"), 1);
	assert_int_equal(durability_required("ANY 3 (a, b, c, d)"), 3);
	/* names that look like the keywords or a number */
	assert_int_equal(durability_required("first"), 1);
	assert_int_equal(durability_required("anyone, s2"), 1);
	assert_int_equal(durability_required("\"2\""), 1);
	assert_int_equal(durability_required("2"), 1);
}

static store_durability judged(const char *commit, const char *names,
			       int attached)
{
	store_durability d = {.attached = attached};
	snprintf(d.commit, sizeof d.commit, "%s", commit);
	snprintf(d.names, sizeof d.names, "%s", names);
	durability_judge(&d);
	return d;
}

static void test_judge(void **state)
{
	(void)state;
	store_durability d = judged("on", "s1", 1);
	assert_int_equal(d.standbys, 1);
	assert_true(d.counted);
	assert_null(durability_risk(&d));
	/* quorum: every candidate shows "quorum", a commit waits for one */
	d = judged("remote_apply", "ANY 1 (a, b, c)", 3);
	assert_int_equal(d.standbys, 1);
	/* named but not attached: commits wait (and hang) */
	d = judged("on", "s1", 0);
	assert_int_equal(d.standbys, 0);
	assert_string_equal(durability_risk(&d),
			    "no synchronous standby is attached");
	/* hidden from the role: what the settings ask for */
	d = judged("on", "FIRST 2 (a, b)", -1);
	assert_int_equal(d.standbys, 2);
	assert_false(d.counted);
	d = judged("local", "s1", 1);
	assert_int_equal(d.standbys, 0);
	assert_string_equal(durability_risk(&d),
			    "synchronous_commit does not wait for a standby");
	d = judged("on", "", 0);
	assert_string_equal(durability_risk(&d),
			    "synchronous_standby_names is empty");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_required),
		cmocka_unit_test(test_judge),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
