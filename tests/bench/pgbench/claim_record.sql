-- What idemproxy sends PostgreSQL for one first attempt, as pgbench runs it:
-- the claim and the recording of a 201, two autocommit statements (run with
-- -M prepared, as the proxy prepares its statements). A fresh key's claim
-- on a plain store is the insert of claim_new in src/store_pg.c (a key that
-- exists inserts no row, and the proxy then calls idem_claim). The proxy
-- binds the hash, lease, ttl, owner token, status and body as parameters;
-- constants here cost the server the same. The owner token is made by the
-- proxy; here it is the MD5 of the key's counter and "/owner" as a UUID,
-- computed by the server in both statements. -D run=N -D n=0 start each client's counter, so the
-- number RUN * 10^12 + client * 10^9 + n is new in every transaction and
-- never repeats another client's or another run's; the key is its MD5 as a
-- UUID, random like the keys clients send.
\set n :n + 1
\set key :run * 1000000000000 + :client_id * 1000000000 + :n
INSERT INTO idempotency_records (tenant, operation, idem_key, request_hash, state, owner_token, attempt, lease_until, hold_on_unknown, created_at, updated_at, expires_at, replay_until) VALUES ('default', 'create_payment', md5(:key::text)::uuid::text, '\x9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08'::bytea, 'processing', md5(:key::text || '/owner')::uuid, 1, now() + 30000 * interval '1 millisecond', false, now(), now(), now() + greatest(86400000, 86400000, 30000) * interval '1 millisecond', CASE WHEN 86400000 > 86400000 THEN now() + greatest(86400000, 30000) * interval '1 millisecond' END) ON CONFLICT DO NOTHING;
UPDATE idempotency_records SET state = 'completed', response_status = 201, response_headers = E'Content-Type: application/json\r\nLocation: /v1/payments/pay_1\r\n', response_body = '{"id":"pay_1","object":"payment","idempotency_key":"1"}'::bytea, replayable = true, seal_key = NULL, updated_at = now() WHERE tenant = 'default' AND operation = 'create_payment' AND idem_key = md5(:key::text)::uuid::text AND owner_token = md5(:key::text || '/owner')::uuid AND state IN ('processing', 'released') AND coalesce(replay_until, expires_at) > now() RETURNING wait_notify;
