"""volta-ml: train and evaluate vision-and-language BERTs, compatible with VOLTA/IGLUE files."""

__version__ = "0.1.0"
