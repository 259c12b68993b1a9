"""The text stream: Kafka in and out, and the corpora fed into it.

Owns the local Kafka broker (resolved from Maven Central), the consumer-group reader that
hands workers batches of records and commits only what they finished, the producer that
streams files into a topic, and the generated sample corpus.

May import: ``online.learner`` and ``ps_bridge``'s settings and observability. It knows
nothing of the parameter servers.
"""
