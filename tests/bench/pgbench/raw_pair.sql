-- The raw two-commit pair, as pgbench runs it (-M prepared): claim a new key
-- (INSERT ... ON CONFLICT DO NOTHING), then record the response (UPDATE ...
-- WHERE the primary key AND the owner), each its own autocommit
-- transaction, on bench_raw_pair (raw_pair_table.sql), whose only index is
-- the primary key. The store's limit for first attempts on this machine,
-- independent of idemproxy's schema and statements. Keys as in
-- claim_record.sql (-D run=N -D n=0): new in every transaction, the MD5 of a
-- counter as a UUID, random like the keys clients send; the body is the
-- one claim_record.sql records.
\set n :n + 1
\set key :run * 1000000000000 + :client_id * 1000000000 + :n
\set owner random(1, 9000000000000000000)
INSERT INTO bench_raw_pair (k, owner) VALUES (md5(:key::text)::uuid::text, :owner) ON CONFLICT DO NOTHING;
UPDATE bench_raw_pair SET status = 201, body = '{"id":"pay_1","object":"payment","idempotency_key":"1"}'::bytea WHERE k = md5(:key::text)::uuid::text AND owner = :owner;
