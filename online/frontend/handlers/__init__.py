"""The front end's HTTP handlers, a module per resource (``routes`` maps the URLs to them).

A handler parses the request (``params``), calls the model, the query engine or the history, and
formats the answer as JSON; a client's mistake is an ``ApiError`` it raises, answered by the
middleware. ``queries``: neighbours, analogies and closer-than; ``words``: a word's vector and the
vocabulary; ``history``: what is new (arrivals, rising counts, drift); ``status``: statistics,
health, readiness and metrics; ``documents``: the OpenAPI document and the page.
"""
