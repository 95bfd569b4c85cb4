-- A JWT tenant names its issuer.
--
-- Before this version a tenant from `tenant = "jwt:CLAIM"` was stored as
-- 'jwt:VALUE': after a route's issuer changed, subject 123 of the new
-- issuer replayed the records of subject 123 of the old one. From this
-- version on it is 'jwt:ISSUER:VALUE', ISSUER being the route's
-- jwt.issuer with '%', ':' and bytes outside visible ASCII written as %XX
-- (so the first ':' after it ends it).
--
-- Which issuer a stored 'jwt:VALUE' came from is only known from the conf:
-- `idemproxy -c FILE --migrate` writes, just before it applies this, each
-- jwt route's operation and its new tenant prefix ('jwt:ISSUER:') into
-- idemproxy_tenant_issuers_010. Without that table this migration fails,
-- and nothing is changed.
--
-- The tenant is the distribution column on Citus, which refuses an UPDATE
-- of it: the rows are copied aside, deleted, and inserted again under
-- their new tenant (which may live on another shard), all in the
-- transaction that records this migration.
CREATE TABLE idemproxy_jwt_tenants_010 AS
SELECT r.* FROM idempotency_records r
 WHERE r.tenant LIKE 'jwt:%'
   AND r.operation IN (SELECT operation FROM idemproxy_tenant_issuers_010);

DELETE FROM idempotency_records
 WHERE tenant LIKE 'jwt:%'
   AND (tenant, operation, idem_key) IN (
       SELECT tenant, operation, idem_key FROM idemproxy_jwt_tenants_010);

UPDATE idemproxy_jwt_tenants_010 m
   SET tenant = s.prefix || substr(m.tenant, 5)
  FROM idemproxy_tenant_issuers_010 s
 WHERE m.operation = s.operation;

INSERT INTO idempotency_records SELECT * FROM idemproxy_jwt_tenants_010;

DROP TABLE idemproxy_jwt_tenants_010;

DROP TABLE idemproxy_tenant_issuers_010;
