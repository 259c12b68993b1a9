"""The front end: similarity queries and the live page over HTTP, on a model that keeps learning.

Owns the aiohttp application (handlers that parse, call and format), the sync loop that
pulls changed rows into the search index (``online.search``: the snapshots and their
kernels), the export of one snapshot as a word2vec file (``export``), and the model sources
it serves from: a word2vec file, the parameter servers (``ps_source``, joined as an elastic
worker node) or a plug-in ``module:function``.

May import: ``online.search`` (the index it serves from), ``online.learner`` (vocabulary,
key layout, word2vec format), ``online.stream`` (the sample corpus, for the synthetic
source), ``online.cluster`` (the ps commands and node settings) and ``ps_bridge``. Never
``online.checkpoint``.
"""
