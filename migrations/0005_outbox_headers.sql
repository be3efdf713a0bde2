-- A task's headers (docs/design.md §18) through the outbox: a JSON object
-- of strings, `{"traceparent": "00-…", "tenant": "acme"}`, NULL for none.
-- The relay writes each as the entry's `h:<name>` field. A row written by
-- an earlier peerq has none; a relay of an earlier peerq leaves the column
-- alone, so a row's headers are lost only when such a relay moves it.

ALTER TABLE peerq_outbox ADD COLUMN headers text NULL;
