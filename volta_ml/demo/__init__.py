"""The built-in demo (`volta-ml demo`): synthetic images -> features -> training -> zero-shot and
translate-test evaluation -> IGLUE-style table, every stage through the real code paths."""
