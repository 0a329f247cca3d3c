"""CVQA: the whole pipeline (load the release, extract or read features, score, report) in one room.

`data` reads the release, `prompts` builds the conditions' texts, `zoo` scores with a VOLTA model's matching
head, `features` extracts region features for the photos, `run` ties them together, `report` writes tables,
`cli` is `volta-ml cvqa`.
"""
