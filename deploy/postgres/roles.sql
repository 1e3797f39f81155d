-- Database roles for tidemark, least privilege. Run with psql as a
-- superuser (psql -v ON_ERROR_STOP=1 -f FILE); it is idempotent: run it
-- again after every `tidemark migrate` and whenever sources or aggregates change.
-- `tidemark grants -c tidemark.yaml` prints it for a configuration.
--
-- Roles:
--   migration role  owns the schemas tidemark and raw and tidemark's state
--                   tables; used by `tidemark migrate` only (and by `tidemark run`
--                   with warehouse.migrate: true, which the runtime role
--                   cannot use: set it to false).
--   runtime role    every other command. SELECT, INSERT, UPDATE, DELETE on
--                   the state tables, SELECT on tidemark.schema_migrations,
--                   no ownership of them: it cannot drop or alter them, nor
--                   the schemas. It creates, and so owns, the tables holding
--                   data: raw.<source> and its partitions (created as event
--                   times arrive, dropped by retention, which needs
--                   ownership), mirrors (columns added as the source gains
--                   them, emptied on a CDC TRUNCATE), aggregate tables and
--                   their __shadow tables (rebuilt and published with DML).
--                   Hence CREATE on raw and on the schemas of mirrors and
--                   aggregates, and TEMPORARY for staging tables.
--                   pg_read_all_stats lets status see the oldest
--                   transaction of other roles.
--   poll role       on a poll source's database: SELECT on the polled table.
--   CDC role        on a CDC source's database: LOGIN REPLICATION (slot
--                   creation and streaming) and SELECT on the tables (initial
--                   snapshot, key checks). tidemark creates a missing
--                   publication, which needs ownership of the tables: this
--                   script creates it instead, as the administrator, so the
--                   CDC role needs no ownership.
-- No role is a superuser or has CREATEROLE or CREATEDB. Passwords are not
-- set here: set them with \password NAME, or use another authentication
-- method, with scram-sha-256 in pg_hba.conf for password logins.

-- This is the generic script; every name is a psql variable:
--   psql -f roles.sql -v migration_role=tidemark_owner -v runtime_role=tidemark_run \
--     -v warehouse_db=warehouse -v data_schema=public \
--     -v poll_role=tidemark_poll -v poll_db=app -v poll_schema=public -v poll_table=customers \
--     -v cdc_role=tidemark_cdc -v cdc_db=shop -v cdc_schema=public -v cdc_table=orders \
--     -v publication=tidemark_shop
-- Repeat the data schema, table and source parts for more of them, or leave them out.

\set ON_ERROR_STOP on

-- The warehouse database.
\connect :"warehouse_db"
SELECT format('CREATE ROLE %I LOGIN', :'migration_role') WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'migration_role') \gexec
SELECT format('CREATE ROLE %I LOGIN', :'runtime_role') WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'runtime_role') \gexec
-- The migration role creates the schemas tidemark and raw if they are missing.
SELECT format('GRANT CONNECT, CREATE, TEMPORARY ON DATABASE %I TO %I', current_database(), :'migration_role') \gexec
SELECT format('GRANT CONNECT, TEMPORARY ON DATABASE %I TO %I', current_database(), :'runtime_role') \gexec
CREATE SCHEMA IF NOT EXISTS tidemark AUTHORIZATION :"migration_role";
CREATE SCHEMA IF NOT EXISTS raw AUTHORIZATION :"migration_role";
GRANT USAGE ON SCHEMA tidemark TO :"runtime_role";
GRANT USAGE, CREATE ON SCHEMA raw TO :"runtime_role";
-- State tables that later migrations create, and those that exist.
ALTER DEFAULT PRIVILEGES FOR ROLE :"migration_role" IN SCHEMA tidemark GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"runtime_role";
SELECT format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %I', string_agg('tidemark.' || t, ', '), :'runtime_role')
FROM unnest(ARRAY['backfill_chunks', 'backfill_runs', 'cdc_gaps', 'cdc_positions', 'cdc_resync_keys', 'cdc_resyncs', 'corrections', 'dead_letters', 'debezium_truncates', 'event_ids', 'ingest_ledger', 'kafka_offsets', 'key_reconciliations', 'load_watermarks', 'partition_arrivals', 'partitions', 'pending_partitions', 'poll_watermarks', 'raw_retention', 'shadow_builds', 'source_pauses', 'source_watermarks', 'verify_runs']) AS t
WHERE to_regclass('tidemark.' || t) IS NOT NULL HAVING count(*) > 0 \gexec
SELECT format('GRANT SELECT ON tidemark.schema_migrations TO %1$I; REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON tidemark.schema_migrations FROM %1$I', :'runtime_role')
WHERE to_regclass('tidemark.schema_migrations') IS NOT NULL \gexec
GRANT pg_read_all_stats TO :"runtime_role";
-- Schemas of mirrors and aggregate tables: the runtime role creates its tables there.
CREATE SCHEMA IF NOT EXISTS :"data_schema" AUTHORIZATION :"migration_role";
GRANT USAGE, CREATE ON SCHEMA :"data_schema" TO :"runtime_role";

-- The database of a poll source, as an administrator of its server.
\connect :"poll_db"
SELECT format('CREATE ROLE %I LOGIN', :'poll_role') WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'poll_role') \gexec
SELECT format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), :'poll_role') \gexec
GRANT USAGE ON SCHEMA :"poll_schema" TO :"poll_role";
GRANT SELECT ON :"poll_schema".:"poll_table" TO :"poll_role";

-- The database of a CDC source, as an administrator of its server.
\connect :"cdc_db"
SELECT format('CREATE ROLE %I LOGIN REPLICATION', :'cdc_role') WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'cdc_role') \gexec
ALTER ROLE :"cdc_role" REPLICATION;
SELECT format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), :'cdc_role') \gexec
GRANT USAGE ON SCHEMA :"cdc_schema" TO :"cdc_role";
GRANT SELECT ON :"cdc_schema".:"cdc_table" TO :"cdc_role";
-- The publication, created by the tables' owner, so the CDC role need not own them.
SELECT format('CREATE PUBLICATION %I FOR TABLE %s WITH (publish_via_partition_root = true)', :'publication', format('%I.%I', :'cdc_schema', :'cdc_table'))
WHERE NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = :'publication') \gexec
