-- Inbox rows are removed after a retention (docs/design.md §10), oldest
-- first and a small batch at a time: this index finds them without a scan.

CREATE INDEX peerq_inbox_done_at ON peerq_inbox (service, done_at);
