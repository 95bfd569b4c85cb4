-- claim_record.sql with the keys spread over 16 tenants (citus.sh), named
-- by the key's counter modulo 16 ("0" to "15"), so that on a distributed
-- store the pairs spread over the shards as the proxy's requests do
-- (BENCH_TENANTS). Bound as a parameter (-M prepared), as the proxy binds
-- it: Citus delegates the claim on the parameter's value.
-- On a plain store the proxy claims a fresh key with claim_new (src/store_pg.c,
-- a plain insert; claim_record.sql); this script calls idem_claim on both,
-- the statement Citus delegates.
\set n :n + 1
\set key :run * 1000000000000 + :client_id * 1000000000 + :n
\set t :key % 16
SELECT o_decision, o_owner, o_attempt, o_lease_ms, o_status, o_headers, o_body, o_replayable FROM idem_claim(:t, 'create_payment', md5(:key::text)::uuid::text, '\x9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08'::bytea, 30000, 86400000, false, gen_random_uuid(), 86400000) \gset c_
UPDATE idempotency_records SET state = 'completed', response_status = 201, response_headers = E'Content-Type: application/json\r\nLocation: /v1/payments/pay_1\r\n', response_body = '{"id":"pay_1","object":"payment","idempotency_key":"1"}'::bytea, replayable = true, updated_at = now() WHERE tenant = :t AND operation = 'create_payment' AND idem_key = md5(:key::text)::uuid::text AND owner_token = :c_o_owner AND state IN ('processing', 'released') AND coalesce(replay_until, expires_at) > now();
