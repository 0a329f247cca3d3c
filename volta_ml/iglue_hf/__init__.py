"""IGLUE tasks with Hugging Face backends (CLIP-family dual encoders, generative image-text models), reading the
images themselves. See docs/hf_models.md; the backends live in `volta_ml/hf/`."""
