#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "migrations.h"
#include "sqlsplit.h"

/* The statements of sql, joined by " | ". */
static const char *split(const char *sql)
{
	static char out[4096];
	size_t pos = 0, n = 0, len;
	const char *st;
	out[0] = 0;
	while (sql_next_statement(sql, &pos, &st, &len)) {
		n += (size_t)snprintf(out + n, sizeof out - n, "%s%.*s",
				      n ? " | " : "", (int)len, st);
		assert_true(pos <= strlen(sql));
	}
	assert_int_equal(pos, strlen(sql));
	return out;
}

static void test_plain_statements(void **state)
{
	(void)state;
	assert_string_equal(split("SELECT 1; SELECT 2;"), "SELECT 1 | SELECT 2");
	assert_string_equal(split("  SELECT 1\n"), "SELECT 1");
	assert_string_equal(split(";;\n ; SELECT 1;;"), "SELECT 1");
	assert_string_equal(split(""), "");
	assert_string_equal(split("  \n-- only a comment\n/* and; another */ "), "");
}

static void test_quotes_hide_semicolons(void **state)
{
	(void)state;
	assert_string_equal(split("SELECT 'a;b'; SELECT 'it''s;'"),
			    "SELECT 'a;b' | SELECT 'it''s;'");
	assert_string_equal(split("SELECT E'x\\';y'; SELECT 2"),
			    "SELECT E'x\\';y' | SELECT 2");
	/* Without E, a backslash is an ordinary byte. */
	assert_string_equal(split("SELECT 'x\\'; SELECT 2"),
			    "SELECT 'x\\' | SELECT 2");
	/* ...also after an identifier ending in e. */
	assert_string_equal(split("SELECT name'x\\'; SELECT 2"),
			    "SELECT name'x\\' | SELECT 2");
	assert_string_equal(split("SELECT 1 AS \"a;\"\"b\"; SELECT 2"),
			    "SELECT 1 AS \"a;\"\"b\" | SELECT 2");
}

static void test_dollar_quotes(void **state)
{
	(void)state;
	assert_string_equal(
		split("CREATE FUNCTION f() RETURNS int AS $$ BEGIN RETURN 1; "
		      "END $$ LANGUAGE plpgsql; SELECT 2"),
		"CREATE FUNCTION f() RETURNS int AS $$ BEGIN RETURN 1; END $$ "
		"LANGUAGE plpgsql | SELECT 2");
	assert_string_equal(
		split("DO $f$ BEGIN PERFORM $$;$$; END $f$; SELECT 2"),
		"DO $f$ BEGIN PERFORM $$;$$; END $f$ | SELECT 2");
	/* $1 is a parameter, and a $ inside a name is part of it. */
	assert_string_equal(split("SELECT $1; SELECT a$b$; SELECT 3"),
			    "SELECT $1 | SELECT a$b$ | SELECT 3");
}

static void test_comments(void **state)
{
	(void)state;
	assert_string_equal(split("-- one; two\nSELECT 1; /* a; /* b; */ c; */ "
				  "SELECT 2 -- end;\n"),
			    "SELECT 1 | SELECT 2 -- end;");
}

static void test_unterminated_text_is_one_statement(void **state)
{
	(void)state;
	assert_string_equal(split("SELECT 1; SELECT 'a; SELECT 2"),
			    "SELECT 1 | SELECT 'a; SELECT 2");
	assert_string_equal(split("SELECT $x$ ; "), "SELECT $x$ ;");
	assert_string_equal(split("SELECT 1 /* ; "), "SELECT 1 /* ;");
}

/* Every embedded migration splits into statements that each start with a
 * keyword, and 008 into its four. */
static void test_the_migrations_split(void **state)
{
	(void)state;
	for (int i = 0; i < n_embedded_migrations; i++) {
		size_t pos = 0, len;
		const char *st;
		int n = 0;
		while (sql_next_statement(embedded_migrations[i].sql, &pos, &st,
					  &len)) {
			assert_true(len > 0);
			assert_true((st[0] >= 'A' && st[0] <= 'Z'));
			n++;
		}
		assert_true(n > 0);
		if (embedded_migrations[i].version == 8)
			assert_int_equal(n, 4);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plain_statements),
		cmocka_unit_test(test_quotes_hide_semicolons),
		cmocka_unit_test(test_dollar_quotes),
		cmocka_unit_test(test_comments),
		cmocka_unit_test(test_unterminated_text_is_one_statement),
		cmocka_unit_test(test_the_migrations_split),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
