-- The record's state keeps its three values, checked by a domain instead of
-- a CHECK constraint on the table. PostgreSQL reads a table's CHECK
-- constraints from their stored text, and folds their constants, at the
-- start of every INSERT and UPDATE of the table: a first attempt paid that
-- twice (its claim and its record), some 15 % of the server's
-- instructions for the two (tests/bench/cg_store.sh, claim_record.sql).
-- A domain's constraint is compiled once per session and kept.
--
-- Nothing is rewritten: the column becomes the domain while the domain has
-- no constraint yet (text and the domain are the same bytes), and the
-- constraint is added NOT VALID, because every row already passed the
-- table's CHECK constraint dropped here, so no scan of the table is made
-- under the lock either. Every value written from now on is checked.
CREATE DOMAIN idem_state AS text;
ALTER TABLE idempotency_records ALTER COLUMN state TYPE idem_state;
ALTER TABLE idempotency_records
    DROP CONSTRAINT idempotency_records_state_check;
ALTER DOMAIN idem_state ADD CONSTRAINT idem_state_check
    CHECK (VALUE IN ('processing', 'completed', 'released')) NOT VALID;
