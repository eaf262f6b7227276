"""The BentoML service: ``POST /classify``, ``GET /model``, the web page and the API docs.

    service.py   the service class: the model from the store by tag, the classify API
    api.py       the request, the response (han's result types) and the model description
    guard.py     the request guard: a bad request gets a 4xx naming the problem
    batcher.py   concurrent requests gathered into shared model calls
    deadline.py  the 504 for a request unanswered within the timeout (in place of BentoML's)
    metrics_dir.py  each server's own Prometheus folder (BentoML's is shared by a BENTOML_HOME's servers)
    connections.py  keep-alive connections ended now and then, so a client pool spreads over the workers
    way_back.py  each answer's inference log line, /metrics counters and feedback-store row
    store_writer.py  the feedback store's writer; answers kept across a restart while the store is down
    settings.py  every environment variable the service reads, read once
    pages.py     the web page, /model, /docs
    process.py   start, wait for and stop a server (``make run``, tests, benchmarks)
    run.py       ``make run``: train the default model if there is none, then serve it

Imports han, model_store and monitoring; never the training code.
"""
