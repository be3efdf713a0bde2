-- peerq's inbox and fences (docs/design.md §10): a handler's
-- writes and the record that its task is done commit together, and a
-- partition's fencing token, moved forward only, turns away a stale owner.

CREATE TABLE peerq_inbox (
    service text NOT NULL,
    task_id text NOT NULL,
    partition int NOT NULL,
    token bigint NOT NULL,
    done_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (service, task_id)
);

CREATE TABLE peerq_fences (
    service text NOT NULL,
    partition int NOT NULL,
    token bigint NOT NULL,
    PRIMARY KEY (service, partition)
);
