"""The search index: the model as queries read it, and the kernels that search it.

Owns the immutable snapshots (``snapshot``) and the queries they answer (``model_index``), how the
next one is built from a source's delta (``delta``, ``snapshot_writer``), the rows and int8 codes behind them,
held once and written out of place so that a sync costs O(changed rows) and no reader sees a
row change (``row_store``), the exact int8-then-float32 scan and its C
kernel (``int8_prefilter``, ``int8_scan.c``), the inverted file and its background build
and recall monitor (``ivf``, ``ivf_build``), finding words by key and by prefix
(``word_lookup``), and searching from other processes that map the same rows instead of
holding a copy (``shared_arrays``, ``search_processes``).

It knows nothing of HTTP, Kafka or the parameter servers: the front end feeds it deltas
and asks it queries. May import: ``online.learner`` (word keys) and ``ps_bridge``'s
structured logging. Never ``online.frontend``.
"""
