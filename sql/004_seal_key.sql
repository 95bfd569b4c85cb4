-- Stored responses sealed at rest (store_encryption): the id of the key that
-- sealed a completed record's headers and body, NULL when they are stored in
-- the clear. The sealed blobs name their key themselves; this column is for
-- `idemproxy --reencrypt`, which re-seals the records not under the active
-- key, and for an operator counting what an old key still protects:
--   SELECT seal_key, count(*) FROM idempotency_records
--    WHERE state = 'completed' GROUP BY 1;
-- Adding a nullable column without a default rewrites nothing.
ALTER TABLE idempotency_records ADD COLUMN seal_key text;
