-- The outbox rows a relay sent and whose delete has committed, until the
-- relay has given their dedup records in Redis an expiry (docs/design.md
-- §10). A relay's claim deletes its rows and inserts these in one
-- transaction, so a marker exists exactly when its row's delete committed:
-- only then may the row's record `{N/p}:dedup:outbox:<task id>` start to
-- expire. The relay removes the markers right after; ones left by a relay
-- that died or lost Redis in between are swept every minute.

CREATE TABLE peerq_outbox_sent (
    service text NOT NULL,
    task_id text NOT NULL,
    -- The Redis partition the task went to: its record is under `{N/p}`.
    partition int NOT NULL,
    sent_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (service, task_id)
);
