-- What idemproxy sends PostgreSQL for one replay: the claim of a key whose
-- first attempt completed (-D key=K names one), which only reads. The last
-- column (not in the proxy's statement) divides by zero unless the decision
-- is a replay, so a wrong key fails the run instead of measuring something
-- else.
SELECT o_decision, o_owner, o_attempt, o_lease_ms, o_status, o_headers, o_body, o_replayable, 1 / (o_decision = 'replay')::int AS replay_check FROM idem_claim('default', 'create_payment', :key, '\x9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08'::bytea, 30000, 86400000, false, gen_random_uuid(), 86400000);
