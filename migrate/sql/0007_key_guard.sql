-- Key reconciliation's limit on deletes (mirror.key_reconcile_max_delete).
-- refused: the run found more mirror rows missing at the source than the
-- limit allows and applied nothing (a dry run: would have applied nothing).
-- forced: the run ignored the limit (`tidemark keys --force`).
ALTER TABLE tidemark.key_reconciliations
    ADD COLUMN refused boolean NOT NULL DEFAULT false,
    ADD COLUMN forced  boolean NOT NULL DEFAULT false;
