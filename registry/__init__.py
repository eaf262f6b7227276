"""``han-model``: the registry's commands beside the model store: compare, promote, rollback, status,
monitor, shadow, export-log (``registry.cli``)."""
