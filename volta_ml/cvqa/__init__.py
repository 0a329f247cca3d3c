"""CVQA: the whole pipeline (load the release, extract or read features, score, report) in one room.

`data` reads the release, `prompts` builds the conditions' texts, `zoo` scores with a VOLTA model's matching
head, `features` extracts region features for the photos, `run` ties them together for the zoo; `backends` is
the scorer table of the other backends (clip, mclip, mllm on `volta_ml.hf`, import) and `backend_run` their
batched, sharded, resumable runner (`chunks`); `report` writes a run's tables, `collect` / `tables` / `paper` /
`figures` the paper's tables over several runs, `cli` is `volta-ml cvqa`.
"""
