-- The admin key listing (GET /admin/keys) walks the records in the order
-- of their creation, newest or oldest first, from a cursor: a range of
-- this index, the primary key's columns after created_at so that every
-- position is one record (keyset paging) and the walk needs no sort.
--
-- created_at, not updated_at: created_at is written only when a key is
-- claimed fresh (or claimed again after it expired), never by complete,
-- release or a takeover, so complete stays a HOT update
-- (006_hot_complete.sql) and this index costs one entry per first
-- attempt. The state is not in it for the same reason: a filter on the
-- state is applied to the rows the walk reads, and the walk reads a
-- bounded number of them per call.
--
-- CREATE INDEX (not CONCURRENTLY: a migration runs in a transaction)
-- blocks writes to the table while the index is built. On Citus it is
-- created on every shard of the distributed table.
CREATE INDEX idempotency_records_created
    ON idempotency_records (created_at, tenant, operation, idem_key);
