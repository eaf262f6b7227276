"""The BentoML service: ``POST /classify``, ``GET /model``, the web page and the API docs.

    service.py   the service class: the model from the store by tag, the classify API
    api.py       the request, the response (han's result types) and the model description
    guard.py     the request guard: a bad request gets a 4xx naming the problem
    batcher.py   concurrent requests gathered into shared model calls
    deadline.py  the 504 for a request unanswered within the timeout (in place of BentoML's)
    connections.py  keep-alive connections ended now and then, so a client pool spreads over the workers
    settings.py  every environment variable the service reads, read once
    pages.py     the web page, /model, /docs
    process.py   start, wait for and stop a server (``make run``, tests, benchmarks)
    run.py       ``make run``: train the default model if there is none, then serve it

Imports han and model_store; never the training code.
"""
