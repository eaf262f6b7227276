"""``han-train``: training and retraining with PyTorch Lightning.

    launch.py   the han-train command: Ctrl-C during the imports stops cleanly, then cli.main
    cli.py      the LightningCLI (configs, links the data's sizes into the model)
    recipe.py   the one place that fills unset settings: from the data's profile, and the run's paths
    data.py     the DataModule: read, tokenise (cached), vocabulary, length-bucketed batches
    sources.py  reading Parquet, CSV, JSON Lines, a folder per class, or a hub name
    module.py   the LightningModule: the optimisation of a han.HAN and its metrics
    export.py   the trained model as users get it: model directory, threshold, report, model store
    report.py   evaluation through han.Pipeline: per-class metrics, confusion matrix, predictions
    callbacks.py  throughput per epoch and ``han-train predict``'s output file
    self_training.py  few labels: a first model labels the unlabelled text for a second fit

Imports han and model_store; never the serving code.
"""
