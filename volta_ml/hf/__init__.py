"""Hugging Face backends (CLIP-family dual encoders, M-CLIP, generative image-text models); contract in base.py."""
