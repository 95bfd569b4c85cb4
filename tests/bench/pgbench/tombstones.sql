-- tombstone_runs (run.sh): :n stripped tombstones of the bench's route, as
-- the reaper leaves them (sql/012_tombstones.sql): completed, status kept,
-- no headers or body, replay_until -infinity, the key kept 30 days.
INSERT INTO idempotency_records
       (tenant, operation, idem_key, request_hash, state, owner_token,
        attempt, lease_until, hold_on_unknown, response_status,
        response_headers, response_body, replayable, created_at,
        updated_at, expires_at, replay_until)
SELECT 'default', 'create_payment', 'tomb-' || i,
       sha256(('tomb-' || i)::bytea), 'completed', gen_random_uuid(), 1,
       now() - interval '1 day', false, 201, NULL, NULL, true,
       now() - interval '2 days', now() - interval '1 day',
       now() + interval '30 days', '-infinity'
  FROM generate_series(1, :n) i;
VACUUM ANALYZE idempotency_records;
