"""The multilingual multimodal suite beyond IGLUE and CVQA (MaXM, XM3600, MTVQA, xMMMU, M3Exam, Kaleidoscope)
with Hugging Face backends: one task table shared with IGLUE's HF tasks (table.py), readers of the released files,
the benchmarks' own rules, the run and its command line (docs/suite.md)."""
