-- Waiting duplicates (in_flight = "wait"): a waiter marks the record it
-- waits for, so that the attempt recording its outcome knows to send a
-- notification. Records nobody waited for are recorded as before, with no
-- NOTIFY. Setting the flag changes no indexed column, so the mark is a HOT
-- update; the flag is never cleared (a record released and taken over
-- keeps its waiters, and at worst sends one notification nobody needs).
-- Adding a column with a constant default rewrites nothing.
ALTER TABLE idempotency_records
    ADD COLUMN wait_notify boolean NOT NULL DEFAULT false;
