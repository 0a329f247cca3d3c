"""Pretraining as VOLTA's train_concap.py / train_concap_wiki.py: masked language and region modelling and
image-text matching on Conceptual Captions, interleaved with Wikipedia text-only batches.

`data.py`: Conceptual Captions samples and VOLTA's batches; `wiki.py`: the Wikipedia text-only MLM batches;
`masking.py`: the corruption rules (tokens, regions, negatives) and the per-sample random streams.
"""
