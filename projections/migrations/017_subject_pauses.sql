-- Subject pause: an operator stops every read path from serving one subject's memories and
-- conversations while the workers keep applying its events. subject_pauses is the current
-- state (a row: paused); subject_pause_log is the audit of every pause and resume.
CREATE TABLE subject_pauses (
    tenant_id    text        NOT NULL,
    subject_type text        NOT NULL,
    subject_id   text        NOT NULL,
    paused_at    timestamptz NOT NULL,
    paused_by    text        NOT NULL,
    PRIMARY KEY (tenant_id, subject_type, subject_id)
);

-- Who paused or resumed which subject, when and why. The reason is an operator's free text
-- and may name the person: it is stored with credentials masked and replaced by a
-- placeholder when the subject is erased (reason_erased_at); the ids, the operator and the
-- times stay, as the deletion ledger's receipt does.
CREATE TABLE subject_pause_log (
    id               bigserial   PRIMARY KEY,
    at               timestamptz NOT NULL,
    tenant_id        text        NOT NULL,
    subject_type     text        NOT NULL,
    subject_id       text        NOT NULL,
    action           text        NOT NULL CHECK (action IN ('pause', 'resume')),
    operator         text        NOT NULL,
    reason           text        NOT NULL,
    reason_erased_at timestamptz
);
CREATE INDEX subject_pause_log_by_subject
    ON subject_pause_log (tenant_id, subject_type, subject_id, at);
