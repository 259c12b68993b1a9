"""The learner: text in, skip-gram negative-sampling (SGNS) updates out.

Owns tokenising, the online vocabulary, the model's key layout (word key, input row,
output row), the noise and subsampling distributions, the SGNS kernel, the trainer that
feeds it, the parameter stores it trains against (in process, or a server's shard) and the
word2vec file format.

May import: numpy, numba, the word segmenters of Chinese and Japanese (``rjieba``, ``sudachipy``)
and ``ps_bridge.settings`` / ``ps_bridge.structured_logging`` only. Nothing here knows about Kafka, the cluster roles, checkpoints or HTTP: it is the
bottom of livevec, and every other subpackage builds on it.
"""
