/* Splits a script of SQL statements at its top-level semicolons, as psql
 * does: not inside a quoted string ('...', E'...'), a quoted identifier,
 * a dollar-quoted body ($$...$$, $tag$...$tag$) or a comment (-- and
 * nested slash-star). A migration is sent one statement at a time because
 * Citus passes a DDL statement's text on to the workers' shards, and
 * refuses a text of several. (BEGIN ATOMIC bodies are not recognised: the
 * migrations use dollar-quoted bodies.) */
#ifndef IDEMPROXY_SQLSPLIT_H
#define IDEMPROXY_SQLSPLIT_H

#include <stdbool.h>
#include <stddef.h>

/* The next statement from *pos on: *start and *len, without the
 * semicolon, the space around it, and comments before it. *pos moves past
 * it. False when only space and comments are left. An unterminated quote
 * or comment makes the rest of the text one statement (the server then
 * says what is wrong with it). */
bool sql_next_statement(const char *sql, size_t *pos, const char **start,
			size_t *len);

#endif
