-- Stored tenants name their source.
--
-- From this version on a static tenant is stored as its name (which may not
-- contain ':'), a header tenant as 'header:VALUE' and an authorization
-- tenant as 'authorization:HEX', so that after a route's tenant source
-- changes no value of one source can reach another source's records.
-- Before, all three were stored bare: a record of 'header:X-Tenant-Id'
-- value "default" and one of 'static:default' were the same record.
--
-- Which bare rows came from a header or a credential is only known from
-- the conf: `idemproxy -c FILE --migrate` writes, just before it applies
-- this, the operations whose tenant source in FILE is a header or
-- Authorization into idemproxy_tenant_sources_003. Their rows get the prefix
-- here, in the transaction that records this migration, so it happens once.
-- Without that table this migration fails, and nothing is changed.
UPDATE idempotency_records r
   SET tenant = s.source || ':' || r.tenant
  FROM idemproxy_tenant_sources_003 s
 WHERE r.operation = s.operation;

DROP TABLE idemproxy_tenant_sources_003;
