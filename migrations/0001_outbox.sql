-- peerq's transactional outbox (docs/design.md §10).
-- `peerq::postgres::Outbox::enqueue` inserts a row in the caller's
-- transaction; a relay moves committed rows to the service's Redis and
-- deletes them. Applied by `peerq::postgres::migrate` or `peerq migrate
-- --postgres URL`, which record it in `peerq_migrations` (never in
-- `_sqlx_migrations`, the application's own).

CREATE TABLE peerq_outbox (
    id bigserial PRIMARY KEY,
    service text NOT NULL,
    -- The id the task keeps in Redis (a UUIDv7), made when it is written.
    task_id text UNIQUE NOT NULL,
    -- fnv1a64(partition key) % 16: a relay takes a lane at a time, so the
    -- rows of one key leave in their order.
    lane int NOT NULL,
    partition_key text NULL,
    idempotency_key text NULL,
    -- Run no earlier than created_at + delay_ms.
    delay_ms bigint NULL,
    codec text NOT NULL,
    payload bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The relay's claim: a service's lane, oldest first.
CREATE INDEX peerq_outbox_claim ON peerq_outbox (service, lane, id);

-- Wakes the relays (they `LISTEN peerq_outbox`) when a row is committed,
-- whoever wrote it; the payload is the service. Postgres sends one
-- notification per service and transaction, however many rows it wrote.
CREATE FUNCTION peerq_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('peerq_outbox', NEW.service);
    RETURN NULL;
END;
$$;

CREATE TRIGGER peerq_outbox_notify AFTER INSERT ON peerq_outbox
    FOR EACH ROW EXECUTE FUNCTION peerq_outbox_notify();
