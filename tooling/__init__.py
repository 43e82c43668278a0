"""What no DVC stage runs, in three packages by who runs it: `build` (building, locking, testing and releasing the
project), `devices` (the checks on a GPU or TPU host, with the TPU's recorded results) and `diagnose` (what a user
runs on their own weights and design). It imports `pipelines`; `pipelines` never imports it, so an edit here can
never move a stage's lineage."""
