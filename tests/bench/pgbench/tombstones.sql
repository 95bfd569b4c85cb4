-- tombstone_runs (run.sh) and doc/design.md's measure of a tombstone: :n
-- stripped tombstones of the bench's route, as the reaper leaves them
-- (sql/012_tombstones.sql): completed, status kept, no headers or body,
-- replay_until -infinity, the key kept 30 days. Keys are UUIDs (36
-- characters) and the times a millisecond apart, as a steady stream of
-- requests leaves them (equal times would shrink the indexes).
INSERT INTO idempotency_records
       (tenant, operation, idem_key, request_hash, state, owner_token,
        attempt, lease_until, hold_on_unknown, response_status,
        response_headers, response_body, replayable, created_at,
        updated_at, expires_at, replay_until)
SELECT 'default', 'create_payment', gen_random_uuid()::text,
       sha256(i::text::bytea),
       'completed', gen_random_uuid(), 1,
       now() - interval '1 day' - i * interval '1 millisecond', false, 201,
       NULL, NULL, true,
       now() - interval '2 days' - i * interval '1 millisecond',
       now() - interval '1 day' - i * interval '1 millisecond',
       now() + interval '30 days' - i * interval '1 millisecond', '-infinity'
  FROM generate_series(1, :n) i;
VACUUM ANALYZE idempotency_records;
